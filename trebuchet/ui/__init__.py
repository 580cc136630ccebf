"""`treb ui`: the web dashboard (the optional `ui` extra: Starlette + uvicorn).

Nothing here is imported by the other verbs: `treb ui` imports it when it runs, so
`treb --help` and the core install never load the web stack. The pages read the same store
and run directories as `treb ps/status/logs/results`; cancel and rerun go through the same
functions as `treb cancel` and `treb rerun` (docs/ui.md).
"""
