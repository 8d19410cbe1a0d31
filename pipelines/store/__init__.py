"""What a build leaves behind, and how it is published and updated.

* `.artifacts`  versioned index directories, manifest, checksums, atomic publish, gc
* `.remote`     index roots on object storage (``s3://``): publish by upload, CURRENT last
* `.docstore`   stored documents for random access (what serving quotes, cites and fetches)
* `.docorder`   every document's id and its rank in doc_id order
* `.reindex`    incremental reindexing: a shard rebuilt from the live version plus new rows
"""
