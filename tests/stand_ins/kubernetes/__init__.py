"""Test double of the Kubernetes client (`kubernetes`): the calls trebuchet makes, backed
by tests/engine_hosts.py, which runs the Job's pods on the ssh test hosts as the Job
controller and kubelets do. The API server it stands for cannot run here
(tests/stand_ins/README.md). State is kept in $TREB_STAND_IN_DIR between processes."""
