"""W1's traffic through BatchElements on the streaming DirectRunner.

Keyed batches (WithBatchKey, 8 shards per prefix) against 2.77.0's
per-process keys (8 workers x 8 SDK processes), both hashed onto the
workers, each worker's batches replayed through an LRU cache of 8 prompt
prefixes. Run on a Beam checkout: python bench_prefix_batching.py
"""
import hashlib
import json
import random
import sys
import tempfile
from collections import OrderedDict

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger
from apache_beam.transforms import util
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Duration
from apache_beam.utils.timestamp import Timestamp

WORKERS, PROCESSES, RATE, REQUESTS, BATCH = 8, 8, 16, 1200, 8
PREFIXES, ZIPF, PREFIX, SUFFIX, CACHED = 64, 1.1, 1024, 64, 8
BATCH_COST, REQUEST_COST = 60.5, 14.0  # prompt-token equivalents


class Clock:
  """Processing time as the arrival of the element last keyed or sized."""
  now = 0

  def key(self, e):
    self.now = e[2]
    return e[1]

  def size(self, e):
    self.now = (e[1] if isinstance(e[0], bytes) else e)[2]
    return 1

  def __call__(self):
    return Timestamp(micros=self.now)


class Write(beam.DoFn):
  def __init__(self, path):
    self.path = path

  def process(self, batch):
    with open(self.path, 'a') as out:
      out.write(json.dumps([[str(k), e] for k, e in batch]) + '\n')


def run(keyed, path):
  rng = random.Random(0)
  weights = [1 / (r + 1)**ZIPF for r in range(PREFIXES)]
  stream, now = TestStream().advance_watermark_to(Timestamp(0)), 0
  for i in range(REQUESTS):
    gap = 1000 * (1 + int(rng.expovariate(RATE * WORKERS) * 1000))
    now += gap
    prefix = rng.choices(range(PREFIXES), weights)[0]
    e = (i, f'p{prefix}', now, rng.randrange(WORKERS * PROCESSES))
    stream.advance_processing_time(Duration(micros=gap))
    stream.add_elements([window.TimestampedValue(e, Timestamp(micros=now))])
  stream.advance_processing_time(Duration(seconds=10))
  clock = Clock()
  p = beam.Pipeline(options=StandardOptions(streaming=True))
  elements = (
      p | stream.advance_watermark_to_infinity()
      | beam.WindowInto(
          window.GlobalWindows(),
          trigger=trigger.Repeatedly(trigger.AfterCount(1)),
          accumulation_mode=trigger.AccumulationMode.DISCARDING))
  if keyed:  # the state key is WithBatchKey's: shard, then the prefix
    elements = elements | beam.ParDo(util.WithBatchKey(clock.key, 8))
  else:  # 2.77.0's stateful path keys by a UUID per SDK process
    elements = elements | beam.Map(lambda e: (str(e[3]).encode(), e))
  _ = (
      elements
      | util.BatchElements(
          min_batch_size=BATCH,
          max_batch_size=BATCH,
          max_batch_duration_secs=1,
          key_fn=lambda kv: kv[0],
          clock=clock,
          element_size_fn=clock.size)
      | beam.ParDo(Write(path)))
  p.run().wait_until_finish()


def replay(path):
  caches = [OrderedDict() for _ in range(WORKERS)]
  load, hits, total = [0.0] * WORKERS, 0, 0
  with open(path) as lines:
    batches = [json.loads(line) for line in lines]
  for batch in batches:
    digest = hashlib.sha256(batch[0][0].encode()).digest()
    w = int.from_bytes(digest[:8], 'big') % WORKERS
    load[w] += BATCH_COST + REQUEST_COST * (len(batch) - 1)
    for _, (_, prefix, _, _) in batch:
      hit = prefix in caches[w]
      caches[w][prefix] = caches[w].pop(prefix, None)
      if len(caches[w]) > CACHED:
        caches[w].popitem(last=False)
      hits += PREFIX * hit
      total += PREFIX + SUFFIX
      load[w] += SUFFIX + PREFIX * (not hit)
  return hits / total, max(load)


if __name__ == '__main__':
  figures = {}
  for name, keyed in (('baseline', False), ('keyed', True)):
    with tempfile.NamedTemporaryFile(suffix='.jsonl', delete=False) as f:
      path = f.name
    run(keyed, path)
    figures[name] = replay(path)
    print(f'{name}: hit rate {figures[name][0]:.3f}', file=sys.stderr)
  ratio = figures['baseline'][1] / figures['keyed'][1]
  print(f'keyed throughput over the baseline: {ratio:.2f}', file=sys.stderr)
