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

One module per phase or part; the pure ones import only the standard
library, so that their tests run without Beam:

* workloads: the reference workloads W0-W4, as timed requests, and the
  regime R = S / C (at_ratio).
* cache: a server's prefix cache (LRU over content-hashed blocks).
* fleet: the streaming batcher (form_batches) and its routes' plumbing.
* frames: DoFn copies (processes x threads), salted positions, key-range
  cutting, LPT and the stateless path's bundles.
* policies: the routes: 2.77.0's per-process keys, WithBatchKey with any
  num_shards, the two-stage policy (AdaptiveNumShards' model).
* costs: benchmark v4's worker: costs, requests in flight and the
  engine's throughput curve.
* deploy: v4's placements (static hash, key ranges re-cut on past work),
  serving, steady-state scoring and the valid upper bound.
* batch: v4's batch deployment (the stateless path, a batch runner's keyed
  step, AdaptiveNumShards in a batch runner).
* v4 and v4_summary: phase A, every strategy in every deployment, regime,
  decode length and placement, and its results.json section.
* validate: the real transforms on the streaming DirectRunner against the
  simulator.
* engine: the engine's throughput curve and v4's points replayed against a
  real vLLM server.
* overhead: the runner cost of keyed batching, over pristine 2.77.0's
  stateful path, and that of the key functions; overhead_worker times the
  runs on one tree.
* learning: phase E, how keyed batches learn their size.
* report, report_phases and report_plot: report.md and the plot, from
  results.json alone.
* blocks: the figures README.md and the pull request descriptions quote,
  from results.json alone, and the check that they do.
* research: the policy research of issue 20 (bench/RESEARCH.md), on
  benchmark v3's simulator.
* research_v4: the run length's tuning of issue 24 on benchmark v4, on
  the tuning seeds (its runs in bench/research_v4_runs/).
"""
