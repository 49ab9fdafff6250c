"""The units of the option structs' fields: durations in seconds and fractions, with the constraints msgspec checks."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

Seconds = Annotated[float, Meta(ge=0)]
PositiveSeconds = Annotated[float, Meta(gt=0)]
Fraction = Annotated[float, Meta(ge=0, le=1)]
