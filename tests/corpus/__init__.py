"""Tests of the third-party model corpus (``bench/corpus``)."""
