"""llama.cpp's switches a model walkthrough takes: one record per setting, named as llama-cli
names it (-fa, -ctk, -ctv, -nr, -ub, -c), with the values the walkthroughs offer.

A setting is a keyword of the walkthrough's run() and a field of llama.cpp's context parameters
(engine/models/params.py ContextParams: what each changes in the graph and the cache). Its value
travels as text (a query's, a recipe's) and is read here the way llama-cli reads it
(`Setting.canonical`: "-fa enabled" is "-fa on", "-ctk Q8_0" is not a type llama.cpp knows),
then handed to run() typed (`Setting.value`). `read_settings` checks a program's whole set:
what it does not take, what llama-cli refuses (its words), what the walkthrough does not offer;
llama.cpp's refusals that depend on the model file (a quantized V cache without flash attention,
a cache block that does not divide the head) are the program's `check_settings` (model.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from engine.core.types import TYPE_TRAITS
from engine.models.params import FLASH_ATTN, KV_CACHE_TYPES, ContextParams, ParamsError, \
    cache_type


class SettingKind(Enum):
    WORD = "word"  # one of llama-cli's words for it (-fa on|off|auto, -ctk f16)
    SWITCH = "switch"  # a flag without a value (-nr): "1" when given
    COUNT = "count"  # a number of tokens or cells (-ub 512, -c 256)


@dataclass(frozen=True, slots=True)
class Setting:
    name: str  # run()'s keyword and ContextParams' field: "flash_attn"
    flag: str  # llama-cli's flag: "-fa"
    kind: SettingKind
    choices: tuple[str, ...]  # the values the walkthroughs offer, as llama-cli writes them
    default: str  # the walkthroughs' value when none is given (llama.cpp's, but for -c)

    @property
    def key(self) -> str:
        """Its name in a URL's query: the flag without its dash ("fa")."""
        return self.flag.lstrip("-")

    def canonical(self, text: str) -> str:
        """The value as the walkthroughs write it (ParamsError, with llama-cli's words where it
        has some, for a value llama.cpp does not take; ValueError for one the walkthroughs do not
        offer)."""
        text = text.strip()
        if self.kind == SettingKind.WORD:
            if self.name == "flash_attn":
                text = ContextParams(flash_attn=text).flash_attn
            else:
                text = TYPE_TRAITS[cache_type(text)].type_name
        elif self.kind == SettingKind.SWITCH:
            words = {"1": "1", "on": "1", "true": "1", "0": "0", "off": "0", "false": "0"}
            if text.lower() not in words:
                raise ValueError(f"{self.flag} is a switch: 1 (given) or 0, not '{text}'")
            text = words[text.lower()]
        if text not in self.choices:
            raise ValueError(f"{self.flag} {text}: the walkthroughs offer {self.flag} "
                             + ", ".join(self.choices))
        return text

    def value(self, text: str) -> str | bool | int:
        """The value run() is given: a word, a bool for a switch, an int for a count."""
        if self.kind == SettingKind.SWITCH:
            return text == "1"
        return int(text) if self.kind == SettingKind.COUNT else text


CACHE_TYPES = tuple(TYPE_TRAITS[t].type_name for t in KV_CACHE_TYPES)
SETTINGS: dict[str, Setting] = {s.name: s for s in [
    Setting("flash_attn", "-fa", SettingKind.WORD, FLASH_ATTN, "auto"),
    Setting("type_k", "-ctk", SettingKind.WORD, CACHE_TYPES, "f16"),
    Setting("type_v", "-ctv", SettingKind.WORD, CACHE_TYPES, "f16"),
    Setting("no_repack", "-nr", SettingKind.SWITCH, ("0", "1"), "0"),
    # a prompt of up to 256 tokens in ubatches of at least 32: at most 8 graphs
    Setting("n_ubatch", "-ub", SettingKind.COUNT, ("512", "256", "128", "64", "32"), "512"),
    # the walkthroughs' cell budget (llama.cpp's default is the model's own context)
    Setting("n_ctx", "-c", SettingKind.COUNT, ("256", "512", "1024"), "256"),
]}


def read_settings(program: str, takes: tuple[str, ...], given: dict[str, str | None]
                  ) -> tuple[tuple[str, str], ...]:
    """The settings `given` (by name, as text; None: not given) for a walkthrough named
    `program` that takes those named in `takes`: (name, value) pairs in SETTINGS' order, the
    values canonical, those equal to the default left out (so a URL naming a default names the
    same trace). ValueError (ParamsError: llama.cpp's words) for anything refused."""
    out = []
    for name, setting in SETTINGS.items():
        text = given.get(name)
        if text is None or text == "":
            continue
        if name not in takes:
            raise ValueError(f"'{program}' takes no {setting.flag}")
        try:
            text = setting.canonical(text)
        except ParamsError as e:
            raise ParamsError(f"{setting.flag} {text}: {e}") from None
        if text != setting.default:
            out.append((name, text))
    return tuple(out)
