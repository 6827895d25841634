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

"""Phase E: how keyed batching learns its batch sizes.

The reviewed pull request kept an estimator per state key, in state, as the
unkeyed stateful path does; patch 0004 learns one target size per step and
process from every key's full batches. Both run here on the
BundleBasedDirectRunner over the same keyed elements: `per_key` is the
stateful batching DoFn in its unkeyed mode behind WithBatchKey (an estimator
per key and window in state, the reviewed design), `per_step` is
BatchElements(key_fn=...). That runner encodes state, as a distributed runner
does, so every key's estimator is its own copy; the FnApiRunner's state cache
hands the same estimator object to every key instead.

Keys are drawn with Zipf popularity, 16 elements per key on average, so a
few keys are busy and most are not. The step after BatchElements stands for
a model: it moves a fake clock, which BatchElements times batches by, on by
the batch's cost. A prefix the model served recently costs less (a prefix
cache of CACHED_KEYS keys). The figures: the mean batch, how many batches
hold one element, and the model's seconds per element.
"""

import collections
import random
import uuid

import apache_beam as beam
from apache_beam import coders
from apache_beam.transforms import util

ELEMENTS_PER_KEY = 16
ZIPF_S = 1.1
MIN_BATCH_SIZE, MAX_BATCH_SIZE = 1, 64
# The model: a batch costs a fixed time plus a time per element; an element
# whose prefix is cached costs CACHED_ELEMENT_SECS instead.
BATCH_SECS, ELEMENT_SECS, CACHED_ELEMENT_SECS = 0.5, 0.05, 0.01
CACHED_KEYS = 16


class _Model:
  """The fake clock and the model that moves it, shared by the copies a
  runner deserializes (by id)."""
  _now: dict = collections.defaultdict(float)
  _cached: dict = collections.defaultdict(collections.OrderedDict)
  _batches: dict = collections.defaultdict(list)

  def __init__(self):
    self._id = uuid.uuid4().hex

  def __call__(self):
    return self._now[self._id]

  def run(self, batch):
    key = batch[0][0]
    cached = self._cached[self._id]
    hit = key in cached
    cached[key] = True
    cached.move_to_end(key)
    if len(cached) > CACHED_KEYS:
      cached.popitem(last=False)
    per_element = CACHED_ELEMENT_SECS if hit else ELEMENT_SECS
    cost = BATCH_SECS + per_element * len(batch)
    self._now[self._id] += cost
    self._batches[self._id].append((len(batch), cost))

  def batches(self):
    return self._batches.pop(self._id, [])


def _key(element):
  return element[0]


def elements(keys: int, seed: int) -> list:
  rng = random.Random(f'{seed}/learning')
  weights = [1 / (rank + 1)**ZIPF_S for rank in range(keys)]
  drawn = rng.choices(range(keys), weights, k=keys * ELEMENTS_PER_KEY)
  return [(f'prefix-{k}', i) for i, k in enumerate(drawn)]


def run(variant: str, keys: int, seed: int) -> dict:
  model = _Model()
  batching = dict(
      min_batch_size=MIN_BATCH_SIZE, max_batch_size=MAX_BATCH_SIZE, clock=model)
  with beam.Pipeline(runner='BundleBasedDirectRunner') as p:
    keyed = p | beam.Create(elements(keys, seed), reshuffle=False)
    if variant == 'per_step':
      batches = keyed | util.BatchElements(key_fn=_key, **batching)
    else:
      estimator = util._BatchSizeEstimator(
          min_batch_size=MIN_BATCH_SIZE,
          max_batch_size=MAX_BATCH_SIZE,
          clock=model)
      batches = (
          keyed
          | beam.ParDo(util.WithBatchKey(_key))
          | beam.ParDo(
              util._pardo_stateful_batch_elements(
                  coders.registry.get_coder(tuple),
                  estimator,
                  max_buffering_duration_secs=1,
                  clock=model,
                  keyed=False)))
    _ = batches | beam.Map(model.run)
  sizes_and_costs = model.batches()
  sizes = [size for size, _ in sizes_and_costs]
  return {
      'mean_batch_size': sum(sizes) / len(sizes),
      'batches_of_one': sum(size == 1 for size in sizes) / len(sizes),
      'model_secs_per_element': sum(cost for _, cost in sizes_and_costs) /
      sum(sizes),
  }


def learning(quick: bool, progress) -> tuple[dict, dict]:
  key_counts = (64, 1024) if quick else (64, 1024, 10000)
  seeds = (1, ) if quick else (1, 2, 3)
  runs: dict = {}
  for keys in key_counts:
    for variant in ('per_key', 'per_step'):
      progress(f'E: {variant}, {keys} keys')
      runs.setdefault(str(keys), {})[variant] = [
          run(variant, keys, seed) for seed in seeds
      ]
  summary = {}
  for keys, variants in runs.items():
    figures = {}
    for variant, results in variants.items():
      for figure in results[0]:
        figures[f'{variant}_{figure}'] = sorted(
            r[figure] for r in results)[len(results) // 2]
    figures['per_step_speedup'] = (
        figures['per_key_model_secs_per_element'] /
        figures['per_step_model_secs_per_element'])
    summary[keys] = figures
  return summary, {
      'elements_per_key': ELEMENTS_PER_KEY,
      'zipf_s': ZIPF_S,
      'seeds': list(seeds),
      'runs': runs,
  }
