"""The DynamoDB ledger: item keys (`keys`), batches and groups (`batches`), rollouts and limits (`rollouts`)."""
