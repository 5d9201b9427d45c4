"""`python -m tests.integration.fake_scheduler_process PORT`: a gRPC scheduler with no model behind it, for tests
that run real gateway processes but not the engine: it answers health SERVING, describes the default model's
tokenizer facts and answers every Generate with three tokens and STOP."""

from __future__ import annotations

import asyncio
import sys

import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pagedserve.services.gateway.routing.scheduler_client import SCHEDULER_SERVICE
from pagedserve.services.proto_convert.common import description_to_pb
from pagedserve.services.proto_gen import scheduler_pb2, scheduler_pb2_grpc
from pagedserve.shared.step_protocol import ModelDescription

DESCRIPTION = ModelDescription(model_name="SmolLM2-135M-Instruct", architecture="LlamaForCausalLM",
                               max_model_len=2048, vocab_size=49152, num_kv_blocks=256, block_size=16,
                               eos_token_ids=(2,), dtype="float32", device="cpu", attention_backend="torch",
                               kv_cache_bytes=1)
REPLY_IDS = (504, 3458, 30)  # three ordinary tokens of the default model's vocabulary


class FakeScheduler(scheduler_pb2_grpc.SchedulerServiceServicer):
    async def Generate(self, request, context):  # noqa: N802
        yield scheduler_pb2.GenerateChunk(token_ids=list(REPLY_IDS), num_prompt_tokens=len(request.prompt_token_ids),
                                          num_output_tokens=len(REPLY_IDS),
                                          finish_reason=scheduler_pb2.FINISH_REASON_STOP)

    async def GetStats(self, request, context):  # noqa: N802
        return scheduler_pb2.SchedulerStats()

    async def Describe(self, request, context):  # noqa: N802
        return description_to_pb(DESCRIPTION)

    async def Identify(self, request, context):  # noqa: N802
        return scheduler_pb2.SchedulerIdentity(instance_id="fake-scheduler")


async def serve(port: int) -> None:
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(FakeScheduler(), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await health_servicer.set(SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
