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

"""Tests of beampq.pythons and of toxfile.py, tox's inline plugin that
hands the Pythons found to tox's discovery."""

import argparse
import configparser
import importlib.util
import re
import types

import pluggy
import tox.plugin
import tox.plugin.spec

from beampq import pythons
from beampq.project import ROOT


def fake_pyenv(root, versions, executable=True):
  """A pyenv root holding these versions, each with its bin/pythonX.Y (a
  script that is never run: the discovery only finds it)."""
  (root / 'versions').mkdir(parents=True, exist_ok=True)
  for version in versions:
    minor = '.'.join(re.findall(r'\d+', version)[:2])
    python = root / 'versions' / version / 'bin' / f'python{minor}'
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\n')
    python.chmod(0o755 if executable else 0o644)
  return root


def python_of(root, version):
  minor = '.'.join(version.split('.')[:2])
  return str(root / 'versions' / version / 'bin' / f'python{minor}')


def test_finds_beams_pythons_newest_release_first(tmp_path):
  root = fake_pyenv(
      tmp_path / 'pyenv',
      [
          '3.9.18',
          '3.10.13',
          '3.11.7',
          '3.12.1',
          '3.12.7',
          '3.13.0',
          '3.14.0',
          '3.13.0t',
          '3.12-dev',
          'pypy3.10-7.3.17',
      ])
  # An alias and a pyenv-virtualenv environment: names for a version that
  # is already found.
  (root / 'versions' / '3.12').symlink_to(root / 'versions' / '3.12.7')
  (root / 'versions' / 'tools').symlink_to(root / 'versions' / '3.11.7')
  fake_pyenv(root, ['3.10.14'], executable=False)  # a broken install
  assert pythons.pyenv_pythons({'PYENV_ROOT': str(root)}) == [
      python_of(root, '3.10.13'),
      python_of(root, '3.11.7'),
      python_of(root, '3.12.7'),
      python_of(root, '3.12.1'),
      python_of(root, '3.13.0'),
  ]
  assert pythons.pyenv_pythons({'PYENV_ROOT': str(root)}, ('3.13', '3.9')) == [
      python_of(root, '3.13.0'),
      python_of(root, '3.9.18'),
  ]


def test_the_root_is_pyenvs_default_without_pyenv_root(tmp_path):
  root = fake_pyenv(tmp_path / '.pyenv', ['3.12.1'])
  assert pythons.pyenv_pythons({'HOME': str(tmp_path)
                                }) == [python_of(root, '3.12.1')]
  assert pythons.pyenv_pythons({
      'HOME': str(tmp_path), 'PYENV_ROOT': ''
  }) == [python_of(root, '3.12.1')]


def test_no_pyenv_no_pythons(tmp_path):
  assert pythons.pyenv_pythons({'HOME': str(tmp_path)}) == []
  assert pythons.pyenv_pythons({'PYENV_ROOT': str(tmp_path / 'none')}) == []


def test_beams_pythons_are_the_pyxy_envs_of_tox_ini():
  config = configparser.ConfigParser(interpolation=None)
  config.read(ROOT / 'tox.ini')
  factors = re.search(r'\bpy\{([\d,]+)\}', config['tox']['envlist'])
  assert factors, config['tox']['envlist']
  assert [f'{f[0]}.{f[1:]}'
          for f in factors[1].split(',')] == list(pythons.BEAM_PYTHONS)


def load_toxfile():
  spec = importlib.util.spec_from_file_location('toxfile', ROOT / 'toxfile.py')
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_toxfile_hands_them_to_toxs_discovery(tmp_path, monkeypatch):
  root = fake_pyenv(tmp_path / 'pyenv', ['3.10.13', '3.12.1'])
  monkeypatch.setenv('PYENV_ROOT', str(root))
  # tox's own hook specifications: the plugin's hook must be one of them,
  # with their arguments, for tox to call it.
  plugins = pluggy.PluginManager(tox.plugin.NAME)
  plugins.add_hookspecs(tox.plugin.spec)
  plugins.register(load_toxfile())
  plugins.check_pending()
  given = ['/opt/python3.11', python_of(root, '3.12.1')]
  options = argparse.Namespace(discover=list(given))
  state = types.SimpleNamespace(conf=types.SimpleNamespace(options=options))
  plugins.hook.tox_add_core_config(core_conf=None, state=state)
  assert options.discover == given + [python_of(root, '3.10.13')]


def test_toxfile_leaves_discovery_alone_without_pyenv(tmp_path, monkeypatch):
  toxfile = load_toxfile()
  for root in (fake_pyenv(tmp_path / 'empty', []), tmp_path / 'none'):
    monkeypatch.setenv('PYENV_ROOT', str(root))
    options = argparse.Namespace(discover=['/opt/python3.11'])
    toxfile.tox_add_core_config(
        None,
        types.SimpleNamespace(conf=types.SimpleNamespace(options=options)))
    assert options.discover == ['/opt/python3.11']
