"""llama.cpp's settings on a model walkthrough's Prompt form: one field per setting the walkthrough
takes, labelled with llama-cli's flag (-fa, -ctk...), its value the one the trace was recorded
with. Each changes the trace: the form makes a new one (engine/programs/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import N_, _
from app.views.debugger.where import Where
from engine.programs import PROGRAMS
from engine.programs.settings import SETTINGS, SettingKind

# what each setting changes, in a line (its field's title): every SETTINGS name has one
HELP = {
    "flash_attn": N_("flash attention: one FLASH_ATTN_EXT node per layer (on), or KQ, softmax and "
                     "KQV (off); auto is on, as llama.cpp decides on the CPU"),
    "type_k": N_("the K cache's type"),
    "type_v": N_("the V cache's type (a quantized one only with flash attention)"),
    "no_repack": N_("the weights stay in the file's layout: no CPU_REPACK buffer of interleaved "
                    "blocks"),
    "n_ubatch": N_("the most tokens one graph computes: a longer prompt takes a pass per ubatch"),
    "n_ctx": N_("the cells the KV cache holds (llama.cpp's own default is the model's context)"),
}


@dataclass(frozen=True, slots=True)
class SettingField:
    key: str  # the query's name for it: "fa"
    flag: str  # llama-cli's flag, its label: "-fa"
    switch: bool  # a checkbox (-nr), else a select box of `choices`
    choices: tuple[str, ...]
    value: str  # the trace's
    help: str


@dataclass(frozen=True, slots=True)
class SettingsView:
    fields: tuple[SettingField, ...]
    never_repacked: bool  # the walkthrough has no -nr: its weights are never repacked


def settings_view(where: Where) -> SettingsView | None:
    """The walkthrough's settings with the trace's values (None: it takes none)."""
    if where.is_program or not PROGRAMS[where.name].settings:
        return None
    takes = PROGRAMS[where.name].settings
    given = dict(where.settings)
    fields = tuple(SettingField(s.key, s.flag, s.kind == SettingKind.SWITCH, s.choices,
                                given.get(name, s.default), _(HELP[name]))
                   for name, s in SETTINGS.items() if name in takes)
    return SettingsView(fields, "no_repack" not in takes)
