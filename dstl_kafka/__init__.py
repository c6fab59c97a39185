"""Kafka-log changelog storage (identifier ``kafka``) through confluent-kafka.

Lands with its issue; until then ``dstl.storage=kafka`` reports an unknown storage.
"""
