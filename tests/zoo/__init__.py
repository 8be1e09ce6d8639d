"""Tests of the bundled models (``autoremat.zoo``)."""
