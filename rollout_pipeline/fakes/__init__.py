"""Stand-ins for AWS that tests, benchmarks and local mode run on (never the Lambdas): the in-process fake of
AgentCore Runtime (`acr`) and the faithful profile that makes moto answer as real AWS does (`faithful`)."""
