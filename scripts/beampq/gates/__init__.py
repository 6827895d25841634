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

"""Beam's gates on the patched tree: its tests, its lint, and a ratchet that
fails only on findings the queue adds.

  workspace  the patched tree as the gates see it, worked out once
  suite      Beam's pytest setup: the test and regression gates
  findings   what lint tools report, their parsers, and the ratchet
  lint       the lint, pylint, mypy and format gates
"""
