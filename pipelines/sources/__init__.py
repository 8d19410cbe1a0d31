"""Where documents come from: a corpus read, checked and bounded before anything is built.

* `.corpus`     BEIR directories, JSONL and Parquet, local or remote: read and validated rows
* `.folder`     a folder of files as a corpus (one readable file, one document; ``formats/``)
* `.walk`       listing a folder without leaving it: links, loops, odd names, exclusions
* `.selection`  which files are read: ``--include``, ``--exclude`` and ``.funnelignore``
* `.fields`     document fields beyond id, title and text: typed, stored as columns per shard
* `.limits`     the bounds on every corpus row
* `.demo`       the embedded demo corpus (the standard library's docstrings)
"""
