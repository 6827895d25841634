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

"""benchmark v4's batch deployment model against the FnApiRunner: the
batches the model forms are those the patched tree's BatchElements forms
on a batch runner, for the default config (issue 24's, with cold keys) and
for 2.77.0's stateless path. Needs the patched tree (tox -e bench-tree);
the harness env skips it."""

from collections import Counter

import pytest

from bench import batch as batch_model
from bench import policies
from bench.workloads import Request

# Keys with these many elements, interleaved in input order.
COUNTS = {'k1': 1, 'k3': 3, 'k8': 8, 'k20': 20, 'k40': 40, 'k100': 100}
BATCH = 8
SEEN: list = []


def _requests():
  pending = {key: count for key, count in COUNTS.items()}
  out = []
  while pending:
    for key in list(pending):
      out.append(Request(len(out), 0, key, 0, ()))
      pending[key] -= 1
      if not pending[key]:
        del pending[key]
  return out


def _record(batch):
  SEEN.append(tuple(sorted(batch)))


@pytest.fixture
def util():
  util = pytest.importorskip('apache_beam.transforms.util')
  if not hasattr(util, 'AdaptiveNumShards'):
    pytest.skip('needs the patched tree (build/beam/sdks/python) on the path')
  return util


def _run(util, elements, **kwargs):
  import apache_beam as beam
  from apache_beam.runners.portability.fn_api_runner import FnApiRunner
  SEEN.clear()
  with beam.Pipeline(runner=FnApiRunner()) as pipeline:
    _ = (
        pipeline
        | beam.Create(elements, reshuffle=False)
        | util.BatchElements(
            min_batch_size=BATCH, max_batch_size=BATCH, **kwargs)
        | beam.Map(_record))
  return list(SEEN)


def _default_real_and_modelled(util, requests):
  """The batches of PrefixBatchingConfig()'s default on the FnApiRunner,
  and the model's state keys' batches for one SDK process, which reads the
  input in one DoFn instance."""
  from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
  spec = PrefixBatchingConfig().num_shards
  assert isinstance(spec, util.AdaptiveNumShards)
  real = _run(
      util, [(r.rid, r.key) for r in requests],
      key_fn=lambda element: element[1],
      num_shards=spec,
      max_batch_duration_secs=1)
  measuring = batch_model.measuring_shards(
      requests, 1, BATCH, spec.bounded_run_batches, 'salt')
  keys = batch_model.two_stage_keys(
      spec,
      requests,
      BATCH,
      cold_key=lambda key: ('cold', 0),
      measuring=measuring)
  return real, batch_model.group(requests, keys, BATCH)


def _normalized(parts):
  """Measuring shards with the other shards counted from the first one
  used, which each reader draws."""
  first = next((m for m in parts if m), 1)
  return [0 if m == 0 else 1 + (m - first) % 15 for m in parts]


def test_the_model_measures_a_busy_key_in_the_trees_parts(util):
  assert util._MEASURING_SHARDS == batch_model.MEASURING_SHARDS
  assert util._MEASURED_WHOLE_BATCHES == batch_model.MEASURED_WHOLE_BATCHES
  # And splits the cold keys where the tree does.
  assert util._COLD_SPLIT_FILLS == policies.COLD_SPLIT_FILLS
  requests = [
      Request(i, 0, 'hot' if i % 4 else f'k{i % 12}', 0, ())
      for i in range(3000)
  ]
  from apache_beam.transforms.window import GlobalWindow
  encode = util._SpreadBatchKey(lambda r: r.key, 2 * 8, 16 * 8)
  encode.setup()
  real = [
      m for r in requests for (_, m), _ in encode.process(r, GlobalWindow())
  ]
  modelled = batch_model.measuring_shards(requests, 1, BATCH, 16, 'salt')
  modelled = [modelled.get(r.rid, 0) for r in requests]
  assert _normalized(real) == _normalized(modelled)
  # The hot key's first two batches on measuring shard 0, then runs of 16
  # batches; the others (250 each) past their first two batches too.
  assert sum(1 for m in real if m) == 3000 - 16 * 4
  assert len(set(real)) == 16


def test_a_busy_key_batches_as_the_model_says(util):
  # 1,000 elements of one key in one reader: its first two batches are
  # measured on measuring shard 0, each further run of 16 batches on
  # another, and the last one's 88 elements on a shard of their own.
  requests = [Request(i, 0, 'hot', 0, ()) for i in range(1000)]
  requests += [Request(1000 + i, 0, f'u{i}', 0, ()) for i in range(20)]
  real, grouped = _default_real_and_modelled(util, requests)
  modelled = [
      tuple(sorted((r.rid, r.key) for r in members))
      for batches in grouped.values() for members in batches
  ]
  assert sorted(real) == sorted(modelled)
  hot = [key for key in grouped if key[0] == 'hot']
  assert len(hot) == 1 + 8
  assert sorted(len(grouped[key]) for key in hot) == [2] + [11] + [16] * 7


def test_the_default_batches_as_the_model_says(util):
  # One SDK process, whose cold elements fill too few batches to split
  # them: one cold state key, whose elements the FnApiRunner's measuring
  # step emits in input order, as the model is given them.
  requests = _requests()
  real, grouped = _default_real_and_modelled(util, requests)
  modelled = [
      tuple(sorted((r.rid, r.key) for r in members))
      for batches in grouped.values() for members in batches
  ]
  assert sorted(real) == sorted(modelled)
  assert [k for k in grouped if k[0] == 'cold'] == [('cold', 0, 0)]
  cold = {
      tuple(sorted((r.rid, r.key) for r in m))
      for m in grouped[('cold', 0, 0)]
  }
  # A key's first 7 elements are cold (8 at one instant make it warm), and
  # the step holds them until the key turns warm: only the keys that never
  # do, k1 and k3, reach the cold keys' batches; the other batches hold one
  # key each.
  assert sum(len(b) for b in cold) == sum(n for n in COUNTS.values() if n < 8)
  for batch in real:
    if batch not in cold:
      assert len({key for _, key in batch}) == 1, batch
  # The key seen once shares a batch with k3.
  (k1, ) = [b for b in real if (0, 'k1') in b]
  assert {key for _, key in k1} == {'k1', 'k3'}


def test_never_warm_keys_fill_batches_as_the_model_says(util):
  # 100 keys seen once, in one SDK process: released at the input's end,
  # they fill cold state keys of 8 batches one after another.
  requests = [Request(i, 0, f'u{i}', 0, ()) for i in range(100)]
  real, grouped = _default_real_and_modelled(util, requests)
  modelled = [len(b) for batches in grouped.values() for b in batches]
  assert sorted(len(b) for b in real) == sorted(modelled)
  assert sorted(modelled) == [4] + [BATCH] * 12
  assert sorted(e for b in real for e in b) == [(r.rid, r.key)
                                                for r in requests]


def test_the_stateless_path_batches_as_the_model_says(util):
  requests = _requests()
  real = _run(util, [(r.rid, r.key) for r in requests])
  batches, _ = batch_model.stateless_batches(requests, 1, BATCH, 'salt')
  assert Counter(len(b)
                 for b in real) == Counter(len(b.requests) for b in batches)
