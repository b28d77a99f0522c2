"""`probe-kv`: what a KV-cache dtype does to the target model's outputs."""
