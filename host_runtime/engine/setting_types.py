"""The rule of each served-model setting, as a type (pydantic's Field: bounds, allowed values): serving.toml's
fields (serving/settings.py), box.toml's [serving] (provisioning/box_model.py, generated from those) and a model's
own settings in the store (models/model_settings.py) take these same types, so none can accept what another
refuses. The bounds themselves are engine/limits.py's plain constants (read by the CLI before it loads anything)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from host_runtime.common.setting_rules import one_of
from host_runtime.engine.limits import (MAX_CONTEXT, MAX_MIB, MAX_PARALLEL, MIN_CONTEXT, MIN_KV_BUDGET_MIB,
                                       SPECULATION)
from host_runtime.placement.kv_types import KV_TYPES

ContextLength = Annotated[int, Field(ge=MIN_CONTEXT, le=MAX_CONTEXT)]
Parallel = Annotated[int, Field(ge=1, le=MAX_PARALLEL)]
KvBudgetMib = Annotated[int, Field(ge=MIN_KV_BUDGET_MIB, le=MAX_MIB)]
ModelsMemoryMib = Annotated[int, Field(ge=64, le=MAX_MIB)]
Speculation = one_of(SPECULATION)
CacheType = one_of(KV_TYPES)
