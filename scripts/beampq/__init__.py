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

"""beampq: this repository's patch queue against a pinned Beam release.

The queue is ``patches/series``: patches to existing upstream files, in
``git format-patch`` form, grouped by the upstream pull request each belongs
to, plus the new files each patch adds, kept under ``sdks/`` at their
upstream paths. The workflow follows Debian's ``gbp pq``: import the queue
as commits (``build/beam``), edit them with git, export them back.

Modules, in the spirit of git-buildpackage:

  series     the data model: pull requests, their patches and new files
  project    the paths of a patch-set repository and its pinned base
  git        the only module that runs git
  sdist      fetch the pinned sdist through pip's index and verify it
  state      whether build/beam is current (built from what patches/ holds)
  newfiles   the files the queue adds: in sdks/, and as their patch adds them
  tree       import the queue as commits: build/beam, kept current
  refresh    write patches/, sdks/ and the series back from the commits
  check      patches/, sdks/, the series and the tree agree
  changes    our CHANGES.md entries, and inserting them into Beam's
  upstream   apply the queue to a Beam checkout; export pull requests
  gates      Beam's tests and lint on the patched tree
  pythons    the Pythons tox finds besides PATH's (pyenv's), for toxfile.py
  __main__   the command line: one function per action
"""


class Error(Exception):
  """A failure reported to the user as one line."""
