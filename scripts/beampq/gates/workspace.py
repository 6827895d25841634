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

"""The patched tree as the gates see it, worked out once per run."""

import functools
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable
from typing import Optional

from beampq import git
from beampq import tree as tree_module
from beampq.project import Project


def python_files(subdir: str, paths: Iterable[str]) -> list[str]:
  """The Python files among tree paths, relative to the sdk folder."""
  prefix = subdir + '/'
  return [
      p[len(prefix):] for p in paths
      if p.startswith(prefix) and p.endswith('.py')
  ]


class Workspace:
  """build/beam as it is, local work included, and what the queue touches.

  Attributes:
    project: the patch-set repository.
    tree: build/beam.
    sdk: the tree's Python SDK folder, where Beam's tools run.
    modified: the Python files (relative to sdk) the queue changes.
    added: the Python files the queue adds.
  """
  def __init__(
      self, project: Project, tree: Path, modified: list[str],
      added: list[str]):
    self.project = project
    self.tree = tree
    self.sdk = tree / project.base.subdir
    self.modified = modified
    self.added = added

  @classmethod
  def open(cls, project: Project) -> 'Workspace':
    """Brings build/beam up to date (keeping local work) and reads what it
    touches."""
    tree = tree_module.update(project, local_work_ok=True)
    modified, added = git.changed_paths(tree, tree_module.BASE_TAG)
    subdir = project.base.subdir
    return cls(
        project,
        tree,
        python_files(subdir, modified),
        python_files(subdir, added))

  @property
  def files(self) -> list[str]:
    return self.modified + self.added

  @property
  def test_modules(self) -> list[str]:
    return [f for f in self.files if f.endswith('_test.py')]

  def pull_request_heads(self) -> Optional[list[tuple[str, str]]]:
    """Each pull request of the series but the last, with the tree's commit
    of its last patch: what it is submitted as. None, with a message, when
    the tree's commits are not one per patch (refresh first)."""
    pull_requests = self.project.read_series().pull_requests
    commits = git.commits_since(self.tree, tree_module.BASE_TAG)
    patches = sum(len(pr.patches) for pr in pull_requests)
    if len(commits) != patches:
      print(
          f'beampq: the tree has {len(commits)} commits for {patches} '
          'patches: its pull requests\' heads cannot be told (refresh '
          'first)')
      return None
    heads, count = [], 0
    for pr in pull_requests[:-1]:
      count += len(pr.patches)
      heads.append((pr.name, commits[count - 1]))
    return heads

  def changed_at(self, commit: str) -> tuple[list[str], list[str]]:
    """The Python files (relative to sdk) a commit of the tree changes and
    adds since the base."""
    modified, added = git.changed_paths(self.tree, tree_module.BASE_TAG, commit)
    subdir = self.project.base.subdir
    return python_files(subdir, modified), python_files(subdir, added)

  def sdk_at(self, commit: str, files: Optional[list[str]], dest: Path) -> Path:
    """Extracts the sdk folder's files (relative to it) at a commit of the
    tree into dest, with the sdk's pyproject.toml (ruff's settings), and
    returns the sdk folder there. With files None, the whole sdk folder."""
    subdir = self.project.base.subdir
    if files is None:
      paths = [subdir]
    else:
      paths = [f'{subdir}/{f}' for f in ['pyproject.toml', *files]]
      paths = [
          path for path in paths
          if git.attempt('cat-file', '-e', f'{commit}:{path}',
                         cwd=self.tree).returncode == 0
      ]
    archive = git.binary_output(
        'archive', '--format=tar', commit, '--', *paths, cwd=self.tree)
    with tempfile.TemporaryFile() as buffer:
      buffer.write(archive)
      buffer.seek(0)
      with tarfile.open(fileobj=buffer) as tar:
        tar.extractall(dest, filter='data')
    return dest / subdir

  @functools.cached_property
  def base_sdk(self) -> Path:
    """The base's Python SDK folder, extracted once into build/base (for
    the ratchets and the regression gate's reruns)."""
    project = self.project
    base_commit = git.output('rev-parse', tree_module.BASE_TAG, cwd=self.tree)
    marker = project.base_files / '.commit'
    sdk = project.base_files / project.base.subdir
    if marker.is_file() and marker.read_text() == base_commit:
      return sdk
    shutil.rmtree(project.base_files, ignore_errors=True)
    project.base_files.mkdir(parents=True)
    archive = git.binary_output(
        'archive', '--format=tar', base_commit, cwd=self.tree)
    with tempfile.TemporaryFile() as buffer:
      buffer.write(archive)
      buffer.seek(0)
      with tarfile.open(fileobj=buffer) as tar:
        tar.extractall(project.base_files, filter='data')
    marker.write_text(base_commit)
    return sdk
