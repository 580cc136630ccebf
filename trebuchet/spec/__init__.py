"""The workload spec: models, YAML loading with located errors, expansion."""
