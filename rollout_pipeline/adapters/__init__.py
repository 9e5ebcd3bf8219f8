"""boto3 implementations of the ports, plus the fake and local ACR adapters."""
