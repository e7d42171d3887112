"""The gRPC contract (`proto/nodus/v1/*.proto`) and its committed generated code."""
