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

"""The vLLM handler of the benchmark's engine phase (imports vllm)."""

from apache_beam.ml.inference.vllm_inference import VLLMCompletionsModelHandler


class _RunningServer(object):
  """Stands in for the handler's own server: one the benchmark started and
  shares between its runs, so that each run does not pay vLLM's start."""
  def __init__(self, port):
    self._port = port

  def get_server_port(self):
    return self._port

  def check_connectivity(self, *unused_args):
    pass


class BenchVLLMHandler(VLLMCompletionsModelHandler):
  """VLLMCompletionsModelHandler against the benchmark's running server."""
  def __init__(self, model, port, **kwargs):
    super().__init__(model, **kwargs)
    self._port = port

  def load_model(self):
    return _RunningServer(self._port)

  def share_model_across_processes(self):
    return False
