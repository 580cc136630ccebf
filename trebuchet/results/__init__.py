"""Performance results: what a workload reports, as rows benchmark dashboards already read.

parse.py    `performance: <number> <metric>` lines (madengine's convention), the HuggingFace
            Trainer's train_samples_per_second, a results CSV (model, performance, metric)
collect.py  one finished run -> rows (rank 0, sum or mean over ranks; run facts; status)
table.py    the `results` table in runs.db (the index) and results.json in the run dir
perfcsv.py  madengine perf.csv-compatible columns, relative change between runs
"""
