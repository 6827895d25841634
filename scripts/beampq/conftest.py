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

"""Fixtures of beampq's tests (helpers in beampq.testing)."""

import importlib.util

import pytest

from beampq import testing
from beampq.project import Project

# The differential suite's pipelines need apache_beam, which the harness env
# does not install: tox -e differential runs their tests.
collect_ignore = [] if importlib.util.find_spec('apache_beam') else [
    'gates/differential_pipelines_test.py'
]


@pytest.fixture
def index(monkeypatch):
  """A package index on 127.0.0.1, set as pip's (PIP_INDEX_URL)."""
  served = testing.Index()
  monkeypatch.setenv('PIP_INDEX_URL', served.url)
  yield served
  served.server.shutdown()


@pytest.fixture(autouse=True)
def identity(monkeypatch):
  """Every test runs as the same git author and committer."""
  for name, value in testing.IDENTITY.items():
    monkeypatch.setenv(name, value)


@pytest.fixture
def project(tmp_path, index) -> Project:
  """A project with two pull requests (testing.make_queue) and its tree."""
  index.publish('apache_beam-9.9.0.tar.gz', testing.SDIST)
  project = testing.make_project(tmp_path / 'repo')
  testing.make_queue(project)
  return project


@pytest.fixture
def follow_up(tmp_path, index) -> Project:
  """A project whose later patches change a file that its first patch adds
  (testing.make_follow_up_queue), and its tree."""
  index.publish('apache_beam-9.9.0.tar.gz', testing.SDIST)
  project = testing.make_project(tmp_path / 'repo')
  testing.make_follow_up_queue(project)
  return project
