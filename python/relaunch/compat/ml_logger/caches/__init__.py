"""``ml_logger.caches``: the summary cache (values stored per key, their
stats on demand) and the key-value cache, as ml-logger 0.10.36 has them."""
