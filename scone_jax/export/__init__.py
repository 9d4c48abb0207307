"""Export: the f-gram table (tensorstore, any kvstore) and the backbone for serving."""
