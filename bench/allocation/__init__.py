"""Helpers of the allocator benchmark (bench/allocator.py): baseline policies and the metrics it
samples. Not part of the product: the console never imports them."""
