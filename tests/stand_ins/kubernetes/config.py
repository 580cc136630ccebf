"""`kubernetes.config` of the stand-in: no kubeconfig is read."""


def load_kube_config() -> None:
    return None
