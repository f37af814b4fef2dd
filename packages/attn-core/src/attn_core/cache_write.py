"""Placeholder until its helper lands the module."""
