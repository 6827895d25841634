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

"""Phases C and D: what keyed batching costs the runner, and what the key
functions cost.

C runs BatchElements(min_batch_size=8, max_batch_size=8) on the FnApiRunner
over the same elements: stateless (the default), stateful (one shared key
per worker) and keyed with 64 keys, at 8 shards (512 state keys) and at 1
(64), in alternating repetitions. It also counts how often Beam's state
cache weighs an entry (statecache.get_deep_size) per state key.
"""

import statistics
import sys
import time
import timeit

import apache_beam as beam
from apache_beam.ml.inference.prefix_batching import ChatPrefixKeyFn
from apache_beam.ml.inference.prefix_batching import PromptPrefixKeyFn
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.worker import statecache
from apache_beam.transforms import util

KEYS = 64


def _prefix(element):
  return element[1]


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


def overhead(quick: bool, progress) -> tuple[dict, dict]:
  count = 3_000 if quick else 100_000
  repetitions = 3
  elements = [(i, f'prefix-{i % KEYS}') for i in range(count)]
  variants = {
      'stateless': ({}, 1),
      'stateful': ({
          'max_batch_duration_secs': 1
      }, 1),
      'keyed_512': ({
          'key_fn': _prefix, 'num_shards': 8
      }, KEYS * 8),
      'keyed_64': ({
          'key_fn': _prefix
      }, KEYS),
  }
  times: dict[str, list[float]] = {name: [] for name in variants}
  weighings: dict[str, list[float]] = {name: [] for name in variants}
  for repetition in range(repetitions):
    for name, (kwargs, state_keys) in variants.items():
      progress(f'C: {name}, {count} elements, repetition {repetition + 1}')
      with _CountingWeigher() as weigher:
        started = time.perf_counter()
        with beam.Pipeline(runner=FnApiRunner()) as pipeline:
          _ = (
              pipeline
              | beam.Create(elements, reshuffle=False)
              | util.BatchElements(
                  min_batch_size=8, max_batch_size=8, **kwargs)
              | beam.combiners.Count.Globally())
        times[name].append(time.perf_counter() - started)
      weighings[name].append(weigher.calls / state_keys)
  medians = {name: statistics.median(t) for name, t in times.items()}
  return {
      'keyed_512_over_stateful': medians['keyed_512'] / medians['stateful'],
      'keyed_64_over_stateful': medians['keyed_64'] / medians['stateful'],
      'keyed_512_over_stateless': medians['keyed_512'] / medians['stateless'],
      'state_cache_weighings_per_key': statistics.median(
          weighings['keyed_512']),
  }, {
      'elements': count,
      'keys': KEYS,
      'repetitions': repetitions,
      'medians_s': medians,
      'times_s': times,
      'weighings_per_state_key': weighings,
  }


def _per_call(fn, argument, number) -> float:
  timings = timeit.repeat(lambda: fn(argument), number=number, repeat=7)
  return statistics.median(timings) / number


def key_cost(quick: bool, progress) -> tuple[dict, dict]:
  progress('D: key functions')
  number = 2_000 if quick else 20_000
  head = 'You answer questions about Apache Beam. ' * 5
  small = (head + 'x' * 1024)[:1024]
  huge = head + 'x' * (8 << 20)
  chat = [
      {
          'role': 'system', 'content': head + 'Be brief.'
      },
      {
          'role': 'user', 'content': 'What is a PCollection?'
      },
  ]
  prompt_key = PromptPrefixKeyFn()
  seconds = {
      'prompt_1kb': _per_call(prompt_key, small, number),
      'prompt_8mb': _per_call(prompt_key, huge, number),
      'chat': _per_call(ChatPrefixKeyFn(), chat, number),
  }
  return {
      'prompt_8mb_over_1kb': seconds['prompt_8mb'] / seconds['prompt_1kb']
  }, {
      'per_call_us': {
          name: s * 1e6
          for name, s in seconds.items()
      }
  }


def main(argv=None) -> int:
  """Runs C and D in a process of their own, so that what the rest of the
  benchmark loaded does not weigh on the state cache; writes them as JSON."""
  import argparse
  import json
  parser = argparse.ArgumentParser(prog='python -m bench.overhead')
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--out', required=True)
  args = parser.parse_args(argv)

  def progress(message):
    print(f'[bench.overhead] {message}', flush=True)

  results = {}
  results['overhead'], results['overhead_runs'] = overhead(args.quick, progress)
  results['key_cost'], results['key_cost_runs'] = key_cost(args.quick, progress)
  with open(args.out, 'w') as f:
    json.dump(results, f)
  return 0


if __name__ == '__main__':
  sys.exit(main())
