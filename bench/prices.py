"""us-east-1 list prices (USD per request or unit) the benchmarks price their counts with, November 2026:
Lambda (https://aws.amazon.com/lambda/pricing/, Arm), SQS standard requests (https://aws.amazon.com/sqs/pricing/),
DynamoDB on-demand write / read request units (https://aws.amazon.com/dynamodb/pricing/on-demand/), EventBridge
custom events (https://aws.amazon.com/eventbridge/pricing/), S3 Standard PUT / GET (https://aws.amazon.com/s3/pricing/).
No imports: `bench_scale.py` reads it before its clock is installed."""

PRICES = {
    "lambda_request": 0.20 / 1e6,
    "lambda_gb_s_arm": 0.0000133334,
    "sqs_request": 0.40 / 1e6,
    "dynamodb_wru": 0.625 / 1e6,
    "dynamodb_rru": 0.125 / 1e6,
    "eventbridge_custom_event": 1.00 / 1e6,
    "s3_put": 0.005 / 1000,
    "s3_get": 0.0004 / 1000,
}
