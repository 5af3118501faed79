"""Interchangeable localizers, registered by name: ``capinterp.localizers.get("cnl")``."""
from capinterp.localizers.base import Localizer, available, get, register

__all__ = ["Localizer", "available", "get", "register"]
