"""The `kafka` source: consumer-group lag. `source.KafkaLag` is the entry; the rest are its parts.

Empty on purpose: importing a module of this package must not load the others (aiokafka is optional).
Its config models live with every other config model, in adapter/config/kafka.py.
"""
