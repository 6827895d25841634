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

"""Phase C's worker: times BatchElements runs on the tree it imports.

bench.overhead starts one worker per tree (pristine 2.77.0 in build/base,
the patched tree in build/beam), each with only its tree and this
repository on PYTHONPATH, and feeds them the runs of every repetition in
turn, one at a time. A worker imports apache_beam once and runs each
pipeline in a child forked from itself, so that every run starts from the
same freshly imported process and nothing one run learns or caches carries
to the next. It reads one run per line on stdin (JSON: the BatchElements
arguments and the elements to make) and writes one result per line on
stdout: the seconds the pipeline took, the batches and elements it emitted,
and how often the state cache weighed a value.
"""

import json
import os
import sys
import time

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.worker import statecache
from apache_beam.transforms import util

# What the pipeline's last step saw: [batches, elements].
TOTALS = [0, 0]


def prefix(element):
  """The key function of the keyed runs: the element's prefix."""
  return element[1]


def _count(batch):
  return 1, len(batch)


def _add(pairs):
  batches = elements = 0
  for b, e in pairs:
    batches += b
    elements += e
  return batches, elements


def _record(totals):
  TOTALS[0], TOTALS[1] = totals


class _CountingWeigher:
  """Wraps statecache.get_deep_size and counts its calls."""
  def __init__(self):
    self.calls = 0
    self._weigh = statecache.get_deep_size

  def __call__(self, *objs):
    self.calls += 1
    return self._weigh(*objs)

  def __enter__(self):
    statecache.get_deep_size = self
    return self

  def __exit__(self, *unused):
    statecache.get_deep_size = self._weigh


def batch_arguments(run: dict) -> dict:
  """BatchElements' arguments for a run: its own, plus key_fn when it is
  keyed, with num_shards 'default' read from PrefixBatchingConfig()."""
  kwargs = dict(run['batch'])
  if run.get('keyed'):
    kwargs['key_fn'] = prefix
    if kwargs.get('num_shards') == 'default':
      from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
      kwargs['num_shards'] = PrefixBatchingConfig().num_shards
  return kwargs


def time_run(run: dict) -> dict:
  """Runs BatchElements over run['elements'] elements, interleaved over
  run['keys'] prefixes, on the FnApiRunner; returns what it measured."""
  elements = [(i, f'prefix-{i % run["keys"]}') for i in range(run['elements'])]
  kwargs = batch_arguments(run)
  with _CountingWeigher() as weigher:
    started = time.perf_counter()
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
      _ = (
          pipeline
          | beam.Create(elements, reshuffle=False)
          | util.BatchElements(**kwargs)
          | beam.Map(_count)
          | beam.CombineGlobally(_add)
          | beam.Map(_record))
    seconds = time.perf_counter() - started
  return {
      'seconds': seconds,
      'batches': TOTALS[0],
      'elements': TOTALS[1],
      'weighings': weigher.calls,
  }


def _forked(run: dict) -> dict:
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(read)
    try:
      result = time_run(run)
    except BaseException as e:  # pylint: disable=broad-except
      result = {'error': f'{type(e).__name__}: {e}'}
    with os.fdopen(write, 'w') as out:
      json.dump(result, out)
    os._exit(0)  # pylint: disable=protected-access
  os.close(write)
  with os.fdopen(read) as pipe:
    text = pipe.read()
  os.waitpid(pid, 0)
  if not text:
    return {'error': 'the run exited without a result'}
  return json.loads(text)


def main() -> int:
  print(json.dumps({'apache_beam': beam.__file__}), flush=True)
  for line in sys.stdin:
    print(json.dumps(_forked(json.loads(line))), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
