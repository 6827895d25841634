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

"""What prefix-aware batching buys and costs: `python -m bench` (tox -e bench).

One module per phase; the pure ones (workloads, cache, fleet, frames,
policies, streaming, blocks) import only the standard library, so that
their tests run without Beam:

* workloads: the reference workloads W1, W2 and W3, as timed requests.
* cache: a server's prefix cache (LRU over content-hashed blocks).
* fleet: the streaming batcher (form_batches), the oracle's routing and
  the loose bound.
* frames: benchmark v3's fleet: DoFn copies (processes x threads), the
  placement frames F1-F3 (salted hashing, balanced key ranges, LPT) and a
  run's costs and figures.
* policies: the routes: 2.77.0's per-process keys, WithBatchKey with any
  num_shards, the two-stage policy, known shares.
* streaming: phase A, every strategy in every frame, placement and sweep
  point.
* validate: the real transforms on the streaming DirectRunner against the
  simulator.
* engine: the fleet replayed against a real vLLM server.
* overhead: the runner cost of keyed batching, over pristine 2.77.0's
  stateful path, and that of the key functions; overhead_worker times the
  runs on one tree.
* report: report.md and the plots, from results.json alone.
* blocks: the figures README.md and the pull request descriptions quote,
  from results.json alone, and the check that they do.
* research: the policy research of issue 20 (bench/RESEARCH.md).
"""
