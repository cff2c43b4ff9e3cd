"""`rlvr-serve`: the policy behind an OpenAI-compatible HTTP endpoint and JetStream's gRPC
server, sampling through the same `rollout.build_rollout` as training and evaluation.

Modules: `cli` (the command), `http` (`OpenAIServer`), `openai_api` (request and response
shapes), `tools` (tool calling), `grpc_server` (`JetStreamFrontEnd`). Importing this package
imports neither TensorFlow, JetStream, torch nor aiohttp.
"""
