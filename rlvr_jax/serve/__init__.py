"""`rlvr-serve`: the policy behind an OpenAI-compatible HTTP endpoint and JetStream's gRPC
server, sampling through the same `rollout.build_rollout` as training and evaluation.

- `cli`: the command (`main`, `build_parser`, `rollout_config`: the engine flags over a
  config's `rollout:` section), start-up order, shutdown.
- `http`: `OpenAIServer`, the aiohttp endpoint over a `RolloutStream` (streaming SSE).
- `openai_api`: request parsing and response shapes of the OpenAI API.
- `grpc_server`: `JetStreamFrontEnd`, JetStream's orchestrator servicer on `grpc.aio`.

Importing this package imports neither TensorFlow, JetStream, torch nor aiohttp.
"""
