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

"""What the tests of beampq share: a fake base sdist, a package index on
127.0.0.1 that serves it, and small patch-set projects whose patches are
made the way a developer makes them (commit in the tree, then refresh)."""

import hashlib
import http.server
import io
import json
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import Optional

from beampq import git
from beampq import refresh
from beampq import series
from beampq import tree
from beampq.project import Project

UTIL = ''.join(f'line {i}\n' for i in range(1, 41))
# The date of the fake release: its newest file.
RELEASED = 1700000000
CHANGES = """\
# [9.9.0] - Unreleased

## New Features / Improvements

<!-- pull request: feature -->
* (Python) Added a thing ([#1](https://github.com/apache/beam/issues/1)).

## Bugfixes

<!-- pull request: fix -->
* (Python) Fixed a bug ([#2](https://github.com/apache/beam/issues/2)).
"""
# Beam's CHANGES.md opens with its template section commented out.
UPSTREAM_TEMPLATE = """\
<!-- license -->

<!-- Template -->
<!--
# [9.X.0] - Unreleased

## Highlights

* New highly anticipated feature X added to Python SDK ([#X](https://github.com/apache/beam/issues/X)).

## Bugfixes

* Fixed X (Java/Python) ([#X](https://github.com/apache/beam/issues/X)).
-->

"""
UPSTREAM_CHANGES = UPSTREAM_TEMPLATE + """\
# [9.9.0] - Unreleased

## Highlights

* New highly anticipated feature X added to Python SDK ([#X](https://github.com/apache/beam/issues/X)).

## New Features / Improvements

* X feature added (Java/Python) ([#X](https://github.com/apache/beam/issues/X)).

## Bugfixes

* (Java) Fixed something else ([#3](https://github.com/apache/beam/issues/3)).
* Fixed X (Java/Python) ([#X](https://github.com/apache/beam/issues/X)).

## Known Issues

[comment]: # ( When updating known issues after release, make sure also update website blog in website/www/site/content/blog.)

# [9.8.0] - 2026-01-01

## Bugfixes

* Fixed X (Java/Python) ([#X](https://github.com/apache/beam/issues/X)).
"""
IDENTITY = {
    'GIT_AUTHOR_NAME': 'Test Author',
    'GIT_AUTHOR_EMAIL': 'author@example.com',
    'GIT_COMMITTER_NAME': 'Test Committer',
    'GIT_COMMITTER_EMAIL': 'committer@example.com',
}
DESCRIPTIONS = {
    'fix': '# [Python] Fix line 5\n\nLine 5 was wrong.\n',
    'feature': '# [Python] Add a module\n\nWhy and what.\n',
}


def forget_identity(monkeypatch, folder: Path):
  """Takes every identity away from git for a test: no GIT_AUTHOR_* or
  GIT_COMMITTER_* variables, empty global and system configs (written in
  folder), no guessing from the host name. A repository's own config still
  counts."""
  for variable in (*IDENTITY, 'EMAIL', 'GIT_CONFIG_NOSYSTEM'):
    monkeypatch.delenv(variable, raising=False)
  for scope in ('GLOBAL', 'SYSTEM'):
    config = folder / f'{scope.lower()}-gitconfig'
    config.write_text('')
    monkeypatch.setenv(f'GIT_CONFIG_{scope}', str(config))
  monkeypatch.setenv('GIT_CONFIG_COUNT', '1')
  monkeypatch.setenv('GIT_CONFIG_KEY_0', 'user.useConfigOnly')
  monkeypatch.setenv('GIT_CONFIG_VALUE_0', 'true')


def make_sdist(files: dict[str, str], top: str = 'apache_beam-9.9.0') -> bytes:
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode='w:gz') as tar:
    for number, (name, text) in enumerate(files.items()):
      data = text.encode()
      info = tarfile.TarInfo(f'{top}/{name}')
      info.size = len(data)
      info.mtime = RELEASED - number
      tar.addfile(info, io.BytesIO(data))
  return buffer.getvalue()


SDIST = make_sdist({
    'apache_beam/__init__.py': '',
    'apache_beam/util.py': UTIL,
    'setup.cfg': '[yapf]\n',
})


class Index:
  """A package index on 127.0.0.1 serving one project's files."""
  def __init__(self):
    self.files = {}
    self.pages = {}
    self.hits = []
    index = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):
        index.hits.append(self.path)
        if self.path in index.pages:
          content_type, body = index.pages[self.path]
        elif self.path in index.files:
          content_type, body = 'application/octet-stream', index.files[
              self.path]
        else:
          self.send_error(404)
          return
        self.send_response(200)
        self.send_header('Content-Type', content_type)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

      def log_message(self, *args):
        pass

    self.server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.url = f'http://127.0.0.1:{self.server.server_port}/simple/'
    threading.Thread(target=self.server.serve_forever, daemon=True).start()

  def publish(self, filename, data, listed_sha=None, html=False):
    sha = listed_sha or hashlib.sha256(data).hexdigest()
    self.files[f'/files/{filename}'] = data
    if html:
      body = (
          f'<html><body><a href="../../files/{filename}#sha256={sha}">'
          f'{filename}</a></body></html>')
      self.pages['/simple/apache-beam/'] = ('text/html', body.encode())
    else:
      body = json.dumps({
          'files': [{
              'filename': filename,
              'url': f'../../files/{filename}',
              'hashes': {
                  'sha256': sha
              }
          }]
      })
      self.pages['/simple/apache-beam/'] = (
          'application/vnd.pypi.simple.v1+json', body.encode())


def make_project(root: Path, sdist: bytes = SDIST) -> Project:
  """A project with no patches yet: its series opens the pull request
  `fix`, and the descriptions of `fix` and `feature` are written."""
  (root / 'patches' / 'pull-requests').mkdir(parents=True)
  (root / 'patches' / 'base.cfg').write_text(
      '[base]\nproject = apache-beam\nversion = 9.9.0\n'
      'filename = apache_beam-9.9.0.tar.gz\n'
      f'sha256 = {hashlib.sha256(sdist).hexdigest()}\n'
      'subdir = sdks/python\n')
  (root / 'patches' / 'series').write_text(
      series.to_text(series.Series([series.PullRequest('fix')])))
  for name, text in DESCRIPTIONS.items():
    (root / 'patches' / 'pull-requests' / f'{name}.md').write_text(text)
  (root / 'CHANGES.md').write_text(CHANGES)
  return Project(root)


def tree_git(project: Project, *args: str) -> str:
  """git in build/beam, as the developer runs it."""
  return git.output(*args, cwd=project.tree, isolated=False)


def commit_in_tree(
    project: Project,
    message: str,
    files: dict[str, str],
    env: Optional[dict[str, str]] = None):
  for path, text in files.items():
    target = project.tree / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
  tree_git(project, 'add', '-A')
  git.run('commit', '-q', '-m', message, cwd=project.tree, env=env)


def start_pull_request(project: Project, name: str, before_patch: str):
  """Starts pull request `name` at a patch, as a developer does: a "[name]"
  line above it in the series."""
  text = project.series_file.read_text()
  project.series_file.write_text(
      text.replace(f'\n{before_patch}\n', f'\n[{name}]\n{before_patch}\n'))


def make_queue(project: Project):
  """Gives a new project two pull requests: `fix` changes a line, then
  `feature` changes another and adds a module and its test."""
  tree.update(project)
  commit_in_tree(
      project,
      '[Python] Change line 5\n\nBecause line 5 was wrong.',
      {'sdks/python/apache_beam/util.py': UTIL.replace('line 5\n', 'five\n')})
  commit_in_tree(
      project,
      '[Python] Add a module',
      {
          'sdks/python/apache_beam/util.py': UTIL.replace(
              'line 5\n', 'five\n').replace('line 30\n', 'thirty\n'),
          'sdks/python/apache_beam/new_mod.py': 'NEW = 1\n',
          'sdks/python/apache_beam/new_mod_test.py': 'import unittest\n',
      })
  refresh.refresh(project)
  start_pull_request(project, 'feature', '0002-Python-Add-a-module.patch')


MODULE = ''.join(f'module line {i}\n' for i in range(1, 21))
MODULE_PATH = 'sdks/python/apache_beam/mod.py'


def module_at(patch: int) -> str:
  """mod.py of make_follow_up_queue as patch 1, 3 or 4 leaves it."""
  text = MODULE
  if patch >= 3:
    text = text.replace('module line 3\n',
                        'three\n').replace('module line 15\n', 'fifteen\n')
  if patch >= 4:
    text = text.replace('module line 4\n', 'four\n')
  return text


def make_follow_up_queue(project: Project):
  """Gives a new project a queue whose later patches change a file that an
  earlier one adds: `fix` adds mod.py (1, no other change) and changes
  line 5 of util.py (2); `feature` changes mod.py and line 30 of util.py
  (3), then mod.py next to its first change (4)."""
  tree.update(project)
  util = project.tree / 'sdks/python/apache_beam/util.py'
  commit_in_tree(project, '[Python] Add mod', {MODULE_PATH: module_at(1)})
  commit_in_tree(
      project,
      '[Python] Change line 5',
      {'sdks/python/apache_beam/util.py': UTIL.replace('line 5\n', 'five\n')})
  commit_in_tree(
      project,
      '[Python] Change mod and line 30',
      {
          MODULE_PATH: module_at(3),
          'sdks/python/apache_beam/util.py': util.read_text().replace(
              'line 30\n', 'thirty\n'),
      })
  commit_in_tree(
      project, '[Python] Change mod again', {MODULE_PATH: module_at(4)})
  refresh.refresh(project)
  start_pull_request(
      project, 'feature', '0003-Python-Change-mod-and-line-30.patch')


def tree_id(repo: Path) -> str:
  return git.output('rev-parse', 'HEAD^{tree}', cwd=repo)


def make_checkout(
    project: Project, path: Path, changes: Optional[str] = None) -> Path:
  """A Beam checkout at the base (optionally with a CHANGES.md)."""
  subprocess.run(['git', 'clone', '-q', str(project.tree), str(path)],
                 check=True)
  git.run('reset', '-q', '--hard', tree.BASE_TAG, cwd=path)
  if changes is not None:
    (path / 'CHANGES.md').write_text(changes)
    git.run('add', 'CHANGES.md', cwd=path, isolated=False)
    git.run('commit', '-q', '-m', 'changes', cwd=path, isolated=False)
  return path
