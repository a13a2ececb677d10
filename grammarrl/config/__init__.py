"""The job's configuration: the declaration of every key (schema), its checks, the generated reference."""
