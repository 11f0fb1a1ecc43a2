"""burnwatch's streaming side: the Faust worker, Kafka publishing, the embedded broker, the CLI."""
