"""Every string the page shows, in English and Russian: one table, key -> {"en": ..., "ru": ...}.

Keys with a dot belong to a section ("attn.title" is the attention charts' title): a chart or panel module
reads its own section with `texts(section, lang)`, everything else one key with `t(key, lang)`. A message
made before the tab's language is known (a refusal deep in the session or the room) is a `Phrase` or a
`Refusal`, rendered in the tab's language where it reaches the page. Values are text, or lists, tuples and
dicts of text where a chart takes several labels at once (the same shape in both languages).

The example prompts are not translations of each other: each language has its own list.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType

LANGS = ("en", "ru")

EXAMPLES = {
    "en": ["What is gravity?", "Write a haiku about the Moon.", "Explain the KV cache in one paragraph.",
           "List three uses of Python."],
    "ru": ["Что такое гравитация?", "Напиши хокку о Луне.", "Почему небо голубое?", "Назови три планеты."],
}

UI = {
    # ---- the follower page (/follow?lang=ru): its own status line; the panels come in the presenter's language
    "follow.title": {"en": "InferLab — following the lecture", "ru": "InferLab — трансляция лекции"},
    "follow.connecting": {"en": "connecting…", "ru": "подключение…"},
    "follow.waiting": {"en": "connected · waiting for the presenter", "ru": "подключено · ждём ведущего"},
    "follow.nobody": {"en": "connected · nobody is presenting yet", "ru": "подключено · лекция ещё не началась"},
    "follow.live": {"en": "live · following the presenter", "ru": "в эфире · следим за ведущим"},
    "follow.catching_up": {"en": "catching up…", "ru": "догоняем…"},
    "follow.disconnected": {"en": "disconnected · reconnecting…", "ru": "связь потеряна · переподключаемся…"},
    "follow.step": {"en": "step {n}", "ru": "шаг {n}"},
    "follow.finished": {"en": "seq #{id} finished", "ru": "посл. №{id} завершена"},
    # ---- the page: header, controls, messages ----
    "title": {"en": "InferLab — a real LLM, one step at a time",
              "ru": "InferLab — настоящая LLM, шаг за шагом"},
    "subtitle": {"en": "Every chart below is drawn from the running engine's own step events.",
                 "ru": "Каждый график ниже построен по событиям работающего движка."},
    "prompt": {"en": "Prompt", "ru": "Запрос"},
    "chat": {"en": "Chat template", "ru": "Шаблон чата"},
    "system": {"en": "System prompt (empty: the model's default)", "ru": "Системный промпт (пусто — по умолчанию)"},
    "examples": {"en": "Examples", "ru": "Примеры"},
    "sampling": {"en": "Sampling", "ru": "Сэмплирование"},
    "temperature": {"en": "Temperature (0 = greedy)", "ru": "Температура (0 — жадно)"},
    "top_k": {"en": "Top-k (0 = off)", "ru": "Top-k (0 — выкл.)"},
    "top_p": {"en": "Top-p", "ru": "Top-p"},
    "min_p": {"en": "Min-p", "ru": "Min-p"},
    "repetition_penalty": {"en": "Repetition penalty", "ru": "Штраф за повтор"},
    "frequency_penalty": {"en": "Frequency penalty", "ru": "Частотный штраф"},
    "presence_penalty": {"en": "Presence penalty", "ru": "Штраф за присутствие"},
    "seed": {"en": "Seed", "ru": "Сид"},
    "max_tokens": {"en": "Max new tokens", "ru": "Макс. новых токенов"},
    "stop": {"en": "Stop strings (comma-separated)", "ru": "Стоп-строки (через запятую)"},
    "step": {"en": "Step", "ru": "Шаг"},
    "run": {"en": "Run", "ru": "Запуск"},
    "pause": {"en": "Pause", "ru": "Пауза"},
    "reset": {"en": "Reset", "ru": "Сброс"},
    "add": {"en": "Add as another request", "ru": "Добавить ещё запрос"},
    "focus": {"en": "Sequence shown", "ru": "Показанная последовательность"},
    "layer": {"en": "Layer", "ru": "Слой"},
    "head": {"en": "Head", "ru": "Голова"},
    "force": {"en": "Force token id at the next step", "ru": "Навязать токен (id) на следующем шаге"},
    "force_btn": {"en": "Force", "ru": "Навязать"},
    "rewind": {"en": "Rewind to generated token #", "ru": "Откатить к сгенерированному токену №"},
    "rewind_btn": {"en": "Rewind", "ru": "Откатить"},
    "branch_btn": {"en": "Branch from there", "ru": "Ответвить оттуда"},
    "word": {"en": "Word for the BPE merge trace", "ru": "Слово для трассы слияний BPE"},
    "neighbour": {"en": "Token position for nearest neighbours (-1 = newest)",
                  "ru": "Позиция токена для ближайших соседей (-1 — последний)"},
    "loading": {"en": "Loading the model…", "ru": "Загружаем модель…"},
    "ready": {"en": "Model ready", "ru": "Модель готова"},
    "idle": {"en": "Nothing to do: enter a prompt and press Step.", "ru": "Нечего делать: введите запрос и нажмите «Шаг»."},
    "finished": {"en": "All sequences finished. Edit the prompt and press Step to start again.",
                 "ru": "Все последовательности завершены. Измените запрос и нажмите «Шаг»."},
    "whatif": {"en": "What-if: the sampling chain recomputed from this step's cached logits; applies from the next step.",
               "ru": "Что-если: цепочка сэмплирования пересчитана по сохранённым логитам; применится со следующего шага."},
    "language": {"en": "Language", "ru": "Язык"},
    "projector": {"en": "Projector mode: larger type", "ru": "Режим проектора: крупный шрифт"},
    "lecture": {"en": "Lecture mode", "ru": "Режим лекции"},
    "token": {"en": "Presenter token (printed when the server starts)",
              "ru": "Токен ведущего (печатается при запуске сервера)"},
    "present": {"en": "Present", "ru": "Вести лекцию"},
    "unpresent": {"en": "Stop presenting", "ru": "Завершить показ"},
    "lab_full": {"en": "The lab is full right now (this server takes {n} at once). Try again in a minute: places "
                       "free up as tabs close.",
                 "ru": "Лаборатория сейчас заполнена (сервер принимает не больше {n} одновременно). Попробуйте "
                       "через минуту: места освобождаются, когда вкладки закрывают."},
    "no_session": {"en": "This tab has no session on the server (the model was still loading, or the tab was "
                         "idle too long): press Step again.",
                   "ru": "У этой вкладки нет сессии на сервере (модель ещё загружалась или вкладка долго "
                         "простаивала): нажмите «Шаг» ещё раз."},
    "step_failed": {"en": "The step failed and was undone; the session is as it was before it. Cause: {cause}",
                    "ru": "Шаг не удался и был отменён; сессия осталась как до него. Причина: {cause}"},
    "failed": {"en": "Something went wrong ({cause}). If it happens again, press Reset.",
               "ru": "Что-то пошло не так ({cause}). Если повторится, нажмите «Сброс»."},
    "spec_busy": {"en": "Another visitor's speed measurement is running: try again in a few seconds.",
                  "ru": "Сейчас идёт замер скорости другого посетителя: попробуйте через несколько секунд."},
    "wrong_token": {"en": "wrong presenter token", "ru": "Неверный токен ведущего."},
    "bad_token": {"en": "Wrong presenter token: look for it in the server's console output.",
                  "ru": "Неверный токен ведущего: он напечатан в консоли сервера."},
    "presenting": {"en": "You are presenting: viewers who open /follow see every step of this session.",
                   "ru": "Вы ведёте лекцию: зрители на странице /follow видят каждый шаг этой сессии (ссылка ниже — по-русски)."},
    "not_presenting": {"en": "Lecture mode stopped; viewers keep the last frame.",
                       "ru": "Показ завершён; у зрителей остаётся последний кадр."},
    "you_present": {"en": "You are presenting", "ru": "Вы ведёте лекцию"},
    "other_presents": {"en": "Another tab is presenting", "ru": "Лекцию ведёт другая вкладка"},
    "nobody_presents": {"en": "Nobody is presenting", "ru": "Сейчас никто не ведёт лекцию"},
    "viewers": {"en": "viewers", "ru": "зрителей"},
    # the room panel (app/charts/room.py): one shared engine, every tab's sequences batched together
    "room_you": {"en": "you", "ru": "вы"},
    "room_presenter": {"en": "presenter", "ru": "ведущий"},  # the presenting tab, on a follower's page
    "room_no_steps": {"en": "No steps yet: press Step or Run — every tab's steps appear here.",
                      "ru": "Шагов ещё нет: нажмите «Шаг» или «Запуск» — здесь появятся шаги всех вкладок."},
    "room_replay": {"en": "A recording holds one tab's view only: the room's shared engine is shown live.",
                    "ru": "Запись хранит вид только одной вкладки: общий движок комнаты виден только вживую."},
    "room_more": {"en": "+{n} more", "ru": "ещё {n}"},
    "room_step": {"en": "step", "ru": "шаг"},
    "room_seq": {"en": "seq", "ru": "посл."},
    # a sequence held to a grammar (an API client's structured output, a tab's grammar box): its kind only
    "room_constrained": {"en": " · constrained: {kind}", "ru": " · с ограничением: {kind}"},
    "room_batch": {"en": "Who is in each step", "ru": "Кто в каждом шаге"},
    "room_batch_title": {"en": "Who is in each step: one block per sequence, coloured by tab (last {n} steps)",
                         "ru": "Кто в каждом шаге: блок на последовательность, цвет — вкладка (последние {n} шагов)"},
    "room_seqs": {"en": "sequences in the step", "ru": "последовательностей в шаге"},
    "room_phase_prefill": {"en": "prefill", "ru": "префилл"},
    "room_phase_decode": {"en": "decode", "ru": "декодирование"},
    "room_phase_verify": {"en": "speculative verify", "ru": "проверка черновика"},
    "room_processed": {"en": "tokens processed", "ru": "токенов обработано"},
    "room_emitted": {"en": "emitted", "ru": "выдано"},
    "room_pool": {"en": "Shared KV pool", "ru": "Общий пул KV"},
    "room_pool_title": {"en": "Shared KV pool: {used} of {n} blocks in use · {cached} cached",
                        "ru": "Общий пул KV: занято {used} из {n} блоков · {cached} в кэше"},
    "room_hit": {"en": "hit rate {pct} %: {hit} of {prompt} prompt tokens served from cache",
                 "ru": "попадания {pct} %: {hit} из {prompt} токенов запросов взяты из кэша"},
    "room_no_hit": {"en": "prefix hit rate: no prompt looked up yet", "ru": "попадания в префиксный кэш: запросов ещё не было"},
    "room_no_pool": {"en": "The shared pool appears after the next step.",
                     "ru": "Общий пул появится после следующего шага."},
    "room_shared": {"en": "shared by several tabs", "ru": "общий для нескольких вкладок"},
    "room_cached": {"en": "cached (free, prefix kept)", "ru": "в кэше (свободен, префикс сохранён)"},
    "room_free": {"en": "free", "ru": "свободен"},
    "room_block": {"en": "block", "ru": "блок"},
    "room_blocks": {"en": "blocks", "ru": "блоки"},
    "room_tps": {"en": "Throughput", "ru": "Пропускная способность"},
    "room_tps_title": {"en": "Tokens per second over the last {span} s: the whole room vs each tab (each point: "
                             "the {w} s before it)",
                       "ru": "Токенов в секунду за последние {span} с: вся комната и каждая вкладка (точка: "
                             "за {w} с до неё)"},
    "room_all": {"en": "room (all tabs)", "ru": "комната (все вкладки)"},
    "room_time": {"en": "seconds (0 = the latest step)", "ru": "секунды (0 — последний шаг)"},
    "room_tok_s": {"en": "tok/s", "ru": "ток/с"},
    "room_size": {"en": "Batch size", "ru": "Размер батча"},
    "room_size_title": {"en": "Batch size per step, and who is kept waiting",
                        "ru": "Размер батча на каждом шаге и кто ждёт"},
    "room_in_batch": {"en": "in the step", "ru": "в шаге"},
    "room_held": {"en": "held (keep their KV)", "ru": "отложены (KV сохранён)"},
    "room_waiting": {"en": "waiting in the queue", "ru": "ждут в очереди"},
    "room_one": {"en": "1 = no batching", "ru": "1 — без батчинга"},
    "room_count": {"en": "sequences", "ru": "последовательности"},
    "room_log": {"en": "Room events", "ru": "События комнаты"},
    "room_no_events": {"en": "No admissions, preemptions or finishes yet.",
                       "ru": "Пока никого не приняли, не вытеснили и не завершили."},
    "room_admitted": {"en": "admitted", "ru": "принята"},
    "room_preempted": {"en": "preempted: KV pool full, will recompute",
                       "ru": "вытеснена: пул KV заполнен, будет пересчитана"},
    "room_finished": {"en": "finished", "ru": "завершена"},
    "room_reason_eos": {"en": "end-of-sequence token", "ru": "токен конца"},
    "room_reason_length": {"en": "max tokens reached", "ru": "достигнут лимит токенов"},
    "room_reason_stop": {"en": "stop string", "ru": "стоп-строка"},
    "room_reason_abort": {"en": "cancelled", "ru": "отменена"},
    "room_reason_grammar": {"en": "grammar complete", "ru": "грамматика завершена"},
    # owners in the room: "tab 3", "api 1", "lecture" (app/room.py names them; the charts show them so)
    "room_owner.tab": {"en": "tab", "ru": "вкладка"},
    "room_owner.api": {"en": "api", "ru": "API"},
    "room_owner.lecture": {"en": "lecture", "ru": "лекция"},
    "tour": {"en": "Guided tour", "ru": "Экскурсия"},
    "spec_box": {"en": "Speculative decoding", "ru": "Спекулятивное декодирование"},
    "spec_on": {"en": "Draft and verify (applies to new requests)", "ru": "Черновик и проверка (для новых запросов)"},
    "spec_method": {"en": "Drafter", "ru": "Черновик"},
    "spec_method.ngram": {"en": "n-gram (prompt lookup)", "ru": "n-граммы (поиск в запросе)"},
    "spec_method.early_exit": {"en": "early exit (layer L)", "ru": "ранний выход (слой L)"},
    "spec_method.draft": {"en": "draft model", "ru": "модель-черновик"},
    "spec_k": {"en": "Draft tokens k", "ru": "Токенов в черновике k"},
    "spec_exit": {"en": "Early-exit layer L", "ru": "Слой раннего выхода L"},
    "spec_adaptive": {"en": "Adaptive k", "ru": "Адаптивное k"},
    "spec_first": {"en": "Turn speculative decoding on first.", "ru": "Сначала включите спекулятивное декодирование."},
    "spec_no_prompt": {"en": "Start a request first (press Step).", "ru": "Сначала запустите запрос («Шаг»)."},
    "spec_measure": {"en": "Measure speedup vs plain", "ru": "Измерить ускорение"},
    "spec_measured": {"en": "Measured on this prompt: {spec:.1f} tok/s with drafting vs {plain:.1f} tok/s plain "
                            "({x:.2f}×); identical tokens: {same}.",
                      "ru": "Измерено на этом запросе: {spec:.1f} ток/с с черновиком против {plain:.1f} ток/с без "
                            "него ({x:.2f}×); токены совпали: {same}."},
    "tour_intro": {"en": "A walk through the eight stages on the live engine: each step runs the engine as "
                         "needed and takes you to its panel.",
                   "ru": "Прогулка по восьми этапам на живом движке: каждый шаг при необходимости запускает "
                         "движок и показывает свою панель."},
    "tour_start": {"en": "Start", "ru": "Начать"},
    "tour_next": {"en": "Next", "ru": "Дальше"},
    "tour_back": {"en": "Back", "ru": "Назад"},
    "tour_replay": {"en": "The tour runs on the live engine: press Reset to leave the replayed trace first.",
                    "ru": "Экскурсия идёт на живом движке: сначала нажмите «Сброс», чтобы выйти из записи."},
    "trace_hint": {"en": "A recorded trace can still be replayed: Trace & export → Load a trace.",
                   "ru": "Записанную сессию всё равно можно воспроизвести: «Запись и экспорт» → «Открыть запись»."},
    "trace_box": {"en": "Trace & export", "ru": "Запись и экспорт"},
    "trace_export": {"en": "Export trace (JSON)", "ru": "Сохранить запись (JSON)"},
    "trace_load": {"en": "Load a trace", "ru": "Открыть запись"},
    "trace_empty": {"en": "Nothing to export yet: press Step first.", "ru": "Пока нечего сохранять: сначала нажмите «Шаг»."},
    "trace_saved": {"en": "Trace saved: download it below. Load it later, even with no model, to replay the session.",
                    "ru": "Запись готова — скачайте её ниже. Её можно открыть позже, даже без модели."},
    "trace_none": {"en": "No file received.", "ru": "Файл не получен."},
    "trace_loaded": {"en": "Replaying a recorded trace ({n} steps, model {model}): Step shows the next recorded "
                           "step; Reset returns to the live engine.",
                     "ru": "Воспроизводится запись ({n} шагов, модель {model}): «Шаг» показывает следующий "
                           "записанный шаг; «Сброс» возвращает к живому движку."},
    "trace_bad": {"en": "This file is not a usable InferLab trace: {detail}",
                  "ru": "Этот файл — не запись InferLab: {detail}"},
    "replay_pos": {"en": "Replay: step {pos} of {n}.", "ru": "Запись: шаг {pos} из {n}."},
    "chart": {"en": "Chart", "ru": "График"},
    # the charts by name, as the export picker lists them
    "chart_name.chart-bytes": {"en": "Bytes per token", "ru": "Байт на токен"},
    "chart_name.chart-pca": {"en": "Embeddings (PCA)", "ru": "Эмбеддинги (PCA)"},
    "chart_name.chart-neighbours": {"en": "Nearest tokens", "ru": "Ближайшие токены"},
    "chart_name.chart-attention": {"en": "Attention of one head", "ru": "Внимание одной головы"},
    "chart_name.chart-heads": {"en": "All heads of a layer", "ru": "Все головы слоя"},
    "chart_name.chart-entropy": {"en": "Attention entropy", "ru": "Энтропия внимания"},
    "chart_name.chart-lens": {"en": "Logit lens", "ru": "Логит-линза"},
    "chart_name.chart-logits": {"en": "Logits and probabilities", "ru": "Логиты и вероятности"},
    "chart_name.chart-perplexity": {"en": "Log-probabilities and perplexity", "ru": "Лог-вероятности и перплексия"},
    "chart_name.chart-sampling": {"en": "Sampling chain", "ru": "Цепочка сэмплирования"},
    "chart_name.chart-cdf": {"en": "Inverse-CDF draw", "ru": "Выбор по обратной CDF"},
    "chart_name.chart-detok": {"en": "Detokenizer", "ru": "Детокенизатор"},
    "chart_name.chart-kv-pool": {"en": "KV block pool", "ru": "Пул блоков KV"},
    "chart_name.chart-kv-tables": {"en": "Block tables", "ru": "Таблицы блоков"},
    "chart_name.chart-kv-memory": {"en": "KV memory", "ru": "Память KV"},
    "chart_name.chart-timeline": {"en": "Step timeline", "ru": "Шкала шагов"},
    "chart_name.chart-latency": {"en": "Latency per sequence", "ru": "Задержки по последовательностям"},
    "chart_name.chart-roofline": {"en": "Roofline", "ru": "Roofline"},
    "chart_name.chart-spec-rounds": {"en": "Speculative rounds", "ru": "Спекулятивные раунды"},
    "chart_name.chart-spec-pq": {"en": "p and q", "ru": "p и q"},
    "chart_name.chart-spec-alpha": {"en": "Acceptance by position", "ru": "Принятие по позициям"},
    "chart_name.chart-spec-pass": {"en": "Tokens per target pass", "ru": "Токенов за проход целевой модели"},
    "chart_name.chart-spec-speedup": {"en": "Speedup vs plain decoding", "ru": "Ускорение относительно обычного декодирования"},
    "chart_name.chart-room-batch": {"en": "Who is in each step", "ru": "Кто в каждом шаге"},
    "chart_name.chart-room-pool": {"en": "Shared KV pool", "ru": "Общий пул KV"},
    "chart_name.chart-room-throughput": {"en": "Throughput", "ru": "Пропускная способность"},
    "chart_name.chart-room-size": {"en": "Batch size", "ru": "Размер батча"},
    "format": {"en": "Format", "ru": "Формат"},
    "export_btn": {"en": "Export chart", "ru": "Экспорт графика"},
    "download": {"en": "Download", "ru": "Скачать"},
    "export_pick": {"en": "Pick a chart to export.", "ru": "Выберите график для экспорта."},
    "export_done": {"en": "{name} is ready: download it below.", "ru": "{name} готов — скачайте ниже."},
    # the commands' own messages (app/commands.py)
    "queued": {"en": "Request #{rid} queued: press Step to watch it join the batch.",
               "ru": "Запрос №{rid} в очереди: нажмите «Шаг», чтобы он вошёл в батч."},
    "forced": {"en": "Token {id} «{text}» will be forced at the next step.",
               "ru": "Токен {id} «{text}» будет навязан на следующем шаге."},
    "branched": {"en": "Branch #{rid} keeps {n} generated tokens and shares their KV blocks.",
                 "ru": "Ветка №{rid} сохраняет {n} сгенерированных токенов и делит их KV-блоки."},
    "rewound": {"en": "Rewound #{sid} to {n} generated tokens; later KV slots were released.",
                "ru": "Последовательность №{sid} откачена до {n} сгенерированных токенов; дальнейшие слоты KV "
                      "освобождены."},
    "no_focus": {"en": "Start a sequence first (press Step).", "ru": "Сначала запустите последовательность («Шаг»)."},
    "need_token": {"en": "Token id: enter a vocabulary id (click a bar in the logits chart).",
                   "ru": "Id токена: введите номер из словаря (или щёлкните столбец на графике логитов)."},
    "need_position": {"en": "Position: enter how many generated tokens to keep.",
                      "ru": "Позиция: введите, сколько сгенерированных токенов оставить."},
    "replay_only_live": {"en": "This is a replayed trace (no model loaded): this control needs a live session.",
                         "ru": "Это воспроизводимая запись (модель не загружена): здесь нужна живая сессия."},
    "no_lecture": {"en": "Lecture mode is not available in this server.",
                   "ru": "Режим лекции на этом сервере недоступен."},
    "waiting": {"en": "waiting: {n} requests ahead of yours", "ru": "ожидание: впереди вашего запроса ещё {n}"},
    "preempted": {"en": "preempted: the KV pool was full; it will be recomputed",
                  "ru": "вытеснен: пул KV был полон; запрос будет пересчитан"},
    # the preemption demo, the queue line in the timeline panel (issue 13, item 7)
    "demo_preempt": {"en": "Preemption demo: a small KV pool", "ru": "Демо вытеснения: маленький пул KV"},
    "demo.short": {"en": "What is gravity?", "ru": "Что такое гравитация?"},
    "demo.long": {"en": "Summarise this paragraph in two sentences: The KV cache stores the keys and values of "
                        "every token a sequence has seen, so each new token attends to them without recomputing "
                        "the whole prompt. A paged cache splits that memory into fixed blocks; the scheduler hands "
                        "blocks to the sequences of a batch and, when the pool runs out, takes them back from the "
                        "newest sequence, which is recomputed later.",
                  "ru": "Перескажи этот абзац в двух предложениях: KV-кэш хранит ключи и значения всех токенов, "
                        "которые видела последовательность, и новый токен смотрит на них, не пересчитывая запрос. "
                        "Страничный кэш делит эту память на блоки; планировщик раздаёт блоки последовательностям "
                        "батча, а когда пул кончается, забирает их у самой новой, и её пересчитывают позже."},
    "demo_started": {"en": "This tab now has an engine of its own with a KV pool of {blocks} blocks ({tokens} "
                           "tokens): request #{a} is short, #{b} long. Press Run (or Step) and watch the timeline: "
                           "as the answers grow the pool runs out and #{b}, the newest, is preempted, then "
                           "recomputed once #{a} has finished. Reset returns to the shared room.",
                     "ru": "У этой вкладки теперь свой движок с пулом KV на {blocks} блоков ({tokens} токенов): "
                           "запрос №{a} короткий, №{b} длинный. Нажмите «Запуск» (или «Шаг») и смотрите на шкалу "
                           "шагов: ответы растут, пул кончается, и №{b}, самый новый, вытесняется, а когда №{a} "
                           "закончится, пересчитывается. «Сброс» вернёт вкладку в общую комнату."},
    "demo_tab_only": {"en": "The preemption demo runs in a browser tab's own session.",
                      "ru": "Демо вытеснения работает только в сессии вкладки браузера."},
    "queue.title": {"en": "Your sequences now:", "ru": "Ваши последовательности сейчас:"},
    "queue.running": {"en": "#{sid}: running", "ru": "№{sid}: выполняется"},
    "queue.none": {"en": "none unfinished; Step starts a new request from the prompt box",
                   "ru": "незавершённых нет; «Шаг» начнёт новый запрос из поля запроса"},
    "queue.waiting": {"en": "#{sid}: waiting, {n} requests ahead", "ru": "№{sid}: ждёт, впереди запросов: {n}"},
    "queue.preempted": {"en": "#{sid}: preempted — the KV pool was full, its blocks were freed; it waits ({n} "
                              "ahead) and will be recomputed",
                        "ru": "№{sid}: вытеснена — пул KV был полон, её блоки освобождены; она ждёт (впереди {n}) "
                              "и будет пересчитана"},
    "queue.recomputed": {"en": "#{sid}: running again, recomputed after {n} preemption(s)",
                         "ru": "№{sid}: снова выполняется, пересчитана после вытеснений: {n}"},
    "queue.own_room": {"en": "this tab's own engine: KV pool of {blocks} blocks",
                       "ru": "собственный движок вкладки: пул KV на {blocks} блоков"},
    # the first screen before any step (issue 13, item 11)
    "preview_hint": {"en": "Press Step: the first step is the prefill, one forward pass over the prompt's {n} "
                           "tokens (panel 1 shows them already).",
                     "ru": "Нажмите «Шаг»: первый шаг — префилл, один прямой проход по {n} токенам запроса "
                           "(они уже показаны в панели 1)."},
    # long actions say what they are doing while they run (issue 13, item 12)
    "progress.spec_plain": {"en": "⏳ Measuring the speed-up: run 1 of 2, plain decoding, {k} / {n} tokens… ({s} s)",
                            "ru": "⏳ Измеряем ускорение: прогон 1 из 2, обычное декодирование, {k} / {n} "
                                  "токенов… ({s} с)"},
    "progress.spec_spec": {"en": "⏳ Measuring the speed-up: run 2 of 2, speculative ({method}), {k} / {n} tokens… "
                                 "({s} s)",
                           "ru": "⏳ Измеряем ускорение: прогон 2 из 2, спекулятивное ({method}), {k} / {n} "
                                 "токенов… ({s} с)"},
    "progress.export_png": {"en": "⏳ Exporting «{name}» as PNG: a headless Chromium draws it… ({s} s)",
                            "ru": "⏳ Экспорт «{name}» в PNG: его рисует браузер без окна… ({s} с)"},
    "progress.export_html": {"en": "⏳ Exporting «{name}» as a standalone HTML file… ({s} s)",
                             "ru": "⏳ Экспорт «{name}» в отдельный HTML-файл… ({s} с)"},
    "progress.trace": {"en": "⏳ Writing the trace of {n} steps…", "ru": "⏳ Записываем трассу из {n} шагов…"},
    "preview_cyrillic": {"en": "SmolLM2-135M was trained on English: it answers Russian with mostly nonsense. "
                               "The tokens below still show something real: Cyrillic takes more tokens per word.",
                         "ru": "SmolLM2-135M обучена на английском: по-русски она отвечает в основном бессмыслицей. "
                               "Но токены ниже показывают настоящее: кириллица занимает больше токенов на слово."},
    "preview_long": {"en": "The prompt is longer than {n} characters: its template and tokens are drawn at the "
                           "first Step.",
                     "ru": "Запрос длиннее {n} символов: его шаблон и токены появятся после первого «Шага»."},
    # ---- the page's frame and lines the server writes (app/ui.py, app/handlers.py, app/render.py) ----
    "measuring": {"en": "measuring this machine…", "ru": "измеряем эту машину…"},
    # app/charts/common.py fmt_bytes: binary units, as memory is sized; fmt_si: decimal prefixes, as rates are quoted
    "byte_units": {"en": ("B", "KiB", "MiB", "GiB", "TiB", "PiB"), "ru": ("Б", "КиБ", "МиБ", "ГиБ", "ТиБ", "ПиБ")},
    "si_prefixes": {"en": ("P", "T", "G", "M", "k"), "ru": ("П", "Т", "Г", "М", "к")},
    "si_units": {"en": {"B": "B", "B/s": "B/s", "FLOP": "FLOP", "FLOP/s": "FLOP/s", "FLOP/B": "FLOP/B"},
                 "ru": {"B": "Б", "B/s": "Б/с", "FLOP": "флоп", "FLOP/s": "флоп/с", "FLOP/B": "флоп/Б"}},
    "time_units": {"en": ("s", "ms", "µs"), "ru": ("с", "мс", "мкс")},
    # hovers of the two rooflines (the live one, the calculators'): Plotly formats the numbers
    "roof_hover": {"en": "%{x:.3g} FLOP/B → %{y:.3s}FLOP/s", "ru": "%{x:.3g} флоп/Б → %{y:.3~e} флоп/с"},
    "point_hover": {"en": "%{x:.3g} FLOP/B · %{y:.3s}FLOP/s", "ru": "%{x:.3g} флоп/Б · %{y:.3~e} флоп/с"},
    "draw_failed": {"en": "This chart cannot be drawn from this trace (a value in it is malformed)",
                    "ru": "Этот график нельзя построить по этой записи (в ней испорчено значение)"},
    "bpe_summary": {"en": "How byte-level BPE builds «{word}», merge by merge",
                    "ru": "Как байтовый BPE собирает «{word}», слияние за слиянием"},
    # a sequence's state in the sequence selector: the scheduler's status, or why it finished
    "seq_status.waiting": {"en": "waiting", "ru": "ждёт"},
    "seq_status.running": {"en": "running", "ru": "выполняется"},
    "seq_status.finished": {"en": "finished", "ru": "завершена"},
    "seq_status.eos": {"en": "eos", "ru": "токен конца"},
    "seq_status.stop": {"en": "stop", "ru": "стоп-строка"},
    "seq_status.length": {"en": "length", "ru": "лимит длины"},
    "seq_status.abort": {"en": "abort", "ru": "прервана"},
    "seq_status.grammar": {"en": "grammar complete", "ru": "грамматика завершена"},
    "refused_detail": {"en": "{detail}", "ru": "Значение не принято: {detail}"},
    # ---- refusals (app/i18n.py Refusal): the English text is also what logs and API clients read ----
    "empty_prompt": {"en": "prompt must not be empty", "ru": "Запрос не должен быть пустым."},
    "text_type": {"en": "{name} must be text", "ru": "Поле «{name}» должно содержать текст."},
    "text_long": {"en": "{name} is {n} characters; the lab accepts up to {limit}",
                  "ru": "Поле «{name}»: {n} символов, а лаборатория принимает не больше {limit}."},
    "not_number": {"en": "{name} must be a number, not {value}", "ru": "Поле «{name}»: нужно число, а не {value}."},
    # a value typed into a slider's box past its range (app/widgets.py): the page puts the slider at the limit
    "range.low": {"en": "{value} is below the slider's minimum {limit}: it is set to {limit}",
                  "ru": "{value} меньше минимума ползунка {limit}: выставлено {limit}"},
    "range.high": {"en": "{value} is above the slider's maximum {limit}: it is set to {limit}",
                   "ru": "{value} больше максимума ползунка {limit}: выставлено {limit}"},
    "not_whole": {"en": "{name} must be a whole number, not {value}",
                  "ru": "Поле «{name}»: нужно целое число, а не {value}."},
    "not_this_tab": {"en": "sequence {sid} is not one of this tab's",
                     "ru": "Последовательность {sid} принадлежит не этой вкладке."},
    "not_yours": {"en": "sequence {sid} is not one of yours", "ru": "Последовательность {sid} — не ваша."},
    "tab_closed": {"en": "this tab was closed; reload the page to start again",
                   "ru": "Эта вкладка была закрыта: перезагрузите страницу, чтобы начать заново."},
    "left_room": {"en": "this session has left the room; reload the page",
                  "ru": "Эта сессия уже покинула комнату: перезагрузите страницу."},
    "cap_seqs": {"en": "you have {n} unfinished sequences, the most one visitor may run at once ({max}); let one "
                       "finish or press Reset",
                 "ru": "Незавершённых последовательностей у вас: {n} — это предел для одного посетителя ({max}); "
                       "дождитесь, пока одна завершится, или нажмите «Сброс»."},
    "cap_prompt": {"en": "your sequences' prompts would hold {n} tokens; one visitor may hold {max}; shorten the "
                         "prompt or press Reset",
                   "ru": "В запросах ваших последовательностей было бы токенов: {n}, а одному посетителю можно не "
                         "больше {max}; сократите запрос или нажмите «Сброс»."},
    "cap_blocks": {"en": "this request may need {need} KV blocks and yours already reserve {have}; one visitor may "
                         "reserve {max} of the room's shared pool; lower max_tokens, shorten the prompt or press "
                         "Reset",
                   "ru": "Этому запросу может понадобиться блоков KV: {need}, а ваши последовательности уже "
                         "резервируют {have}; одному посетителю можно занять не больше {max} блоков общего пула "
                         "комнаты; уменьшите «Макс. новых токенов», сократите запрос или нажмите «Сброс»."},
    "cap_room": {"en": "the room's engine holds {n} sequences, its limit; try again in a minute",
                 "ru": "Движок комнаты заполнен (последовательностей: {n}, это его предел); попробуйте через минуту."},
    "token_wait": {"en": "too many wrong presenter tokens: try again in {wait} s",
                   "ru": "Слишком много неверных токенов ведущего: попробуйте через {wait} с."},
    "trace_too_big": {"en": "the trace is larger than {n} MiB", "ru": "Запись больше {n} МиБ."},
    "bad_format": {"en": "format must be png or html", "ru": "Формат должен быть png или html."},
    "replay_read_only": {"en": "this is a replayed trace (no model loaded): {what} needs a live session",
                         "ru": "Это воспроизводимая запись (модель не загружена): {what} — только в живой сессии."},
    "replay_what.action": {"en": "this action (what-if, force, rewind, a new request)",
                           "ru": "это действие (что-если, навязывание токена, откат, новый запрос)"},
    "replay_what.request": {"en": "a new request", "ru": "новый запрос"},
    "replay_what.params": {"en": "changing sampling parameters", "ru": "изменение параметров сэмплирования"},
    "replay_what.what_if": {"en": "a what-if", "ru": "что-если"},
    "replay_what.force": {"en": "forcing a token", "ru": "навязывание токена"},
    "replay_what.rewind": {"en": "rewinding", "ru": "откат"},
    "replay_what.branch": {"en": "branching", "ru": "ветвление"},
    "replay_no_word": {"en": "«{word}» was not recorded in this trace (a replay has no tokenizer); recorded words: "
                             "{known}",
                       "ru": "Слово «{word}» в этой записи не сохранено (при воспроизведении нет токенизатора); "
                             "сохранённые слова: {known}"},
    "replay_no_words": {"en": "none", "ru": "нет"},
    "replay_no_seq": {"en": "sequence #{sid} does not exist at this point of the trace",
                      "ru": "Последовательности №{sid} в этой точке записи нет."},
    "calc_unknown": {"en": "unknown {what} {value}; choose one of: {ids}",
                     "ru": "Неизвестное значение поля «{what}»: {value}; выберите одно из: {ids}"},
    "calc_whole": {"en": "{name} must be a whole number (got {value})",
                   "ru": "Поле «{name}»: нужно целое число (получено {value})."},
    "calc_number": {"en": "{name} must be a number (got {value})",
                    "ru": "Поле «{name}»: нужно число (получено {value})."},
    "calc_range": {"en": "{name} must be between {lo} and {hi} (got {value})",
                   "ru": "Поле «{name}»: нужно значение от {lo} до {hi} (получено {value})."},
    # the names refusals give the page's boxes
    "name.prompt": {"en": "prompt", "ru": "запрос"},
    "name.system": {"en": "system prompt", "ru": "системный промпт"},
    "name.word": {"en": "word", "ru": "слово для BPE"},
    "name.visible": {"en": "view state (the charts in view)", "ru": "состояние вида (графики на экране)"},
    "name.stop": {"en": "stop strings", "ru": "стоп-строки"},
    "name.grammar": {"en": "grammar", "ru": "грамматика"},
    # constrained decoding (issue 15): the grammar box, its examples and refusals
    "grammar.box": {"en": "Grammar (constrained decoding)", "ru": "Грамматика (ограниченная генерация)"},
    "grammar.label": {"en": "Grammar, «kind: text»: «json:» a JSON schema · «regex:» · «ebnf:» · «choice: a | b» "
                            "(empty: none)",
                      "ru": "Грамматика, «вид: текст»: «json:» JSON-схема · «regex:» · «ebnf:» · «choice: a | b» "
                            "(пусто: без грамматики)"},
    "grammar.ex.json": {"en": "answer as JSON «{name, age}»", "ru": "ответ в JSON «{name, age}»"},
    "grammar.ex.date": {"en": "a date YYYY-MM-DD", "ru": "дата ГГГГ-ММ-ДД"},
    "grammar.ex.yesno": {"en": "yes/no", "ru": "да/нет"},
    # the examples' prompts (the grammar box's text is app/grammar_examples.py's, the same in both languages)
    "grammar.prompt.json": {"en": "Invent a person. Answer as JSON with their name and age.",
                            "ru": "Придумай человека. Ответь в JSON: имя и возраст."},
    "grammar.prompt.date": {"en": "When did the first person land on the Moon? Answer with a date.",
                            "ru": "Когда человек впервые высадился на Луну? Ответь датой."},
    "grammar.prompt.yesno": {"en": "Is the sky blue? Answer yes or no.",
                             "ru": "Небо голубое? Ответь по-английски: «yes» или «no»."},
    "grammar.pair_prompt_a": {"en": "Invent a person.", "ru": "Придумай человека."},
    "grammar.pair_prompt_b": {"en": "Invent another person.", "ru": "Придумай ещё одного человека."},
    "grammar.pair_stable_btn": {"en": "prefix cache: schema keys stable", "ru": "префикс-кэш: ключи схемы по порядку"},
    "grammar.pair_shuffled_btn": {"en": "prefix cache: schema keys shuffled",
                                  "ru": "префикс-кэш: ключи схемы перемешаны"},
    "grammar.pair_stable": {"en": "#{a} and #{b} send the same schema, keys in the same order: #{b} found {n} prompt "
                                  "tokens ({blocks} KV blocks) in the prefix cache. Look at the KV panel.",
                            "ru": "#{a} и #{b} отправляют одну схему с ключами в том же порядке: #{b} нашёл в "
                                  "префикс-кэше {n} токенов запроса ({blocks} KV-блоков). Смотрите панель KV."},
    "grammar.pair_shuffled": {"en": "#{a} and #{b} send the same schema, keys shuffled: #{b} found {n} prompt tokens "
                                    "({blocks} KV blocks) in the prefix cache. Same meaning, different tokens.",
                              "ru": "#{a} и #{b} отправляют одну схему, но ключи перемешаны: #{b} нашёл в "
                                    "префикс-кэше {n} токенов ({blocks} KV-блоков). Смысл тот же, токены другие."},
    # the notice by the prompt while the grammar box holds a grammar (issue 37: a yes/no example's grammar stayed
    # set, and "List three uses of Python." was answered "no")
    "grammar.notice": {"en": "Grammar set:", "ru": "Задана грамматика:"},
    "grammar.notice_title": {"en": "Every answer must match this grammar until you clear it: {grammar}",
                             "ru": "Каждый ответ обязан следовать этой грамматике, пока вы её не уберёте: {grammar}"},
    "grammar.clear": {"en": "Clear grammar", "ru": "Убрать грамматику"},
    "example.new_request": {"en": "Example loaded: the next Step starts it as a new request and stops #{ids}, "
                                  "still unfinished.",
                            "ru": "Пример загружен: следующий шаг начнёт его как новый запрос и остановит "
                                  "незаконченные #{ids}."},
    "example.started": {"en": "New request #{sid} for the example; #{ids} stopped.",
                        "ru": "Новый запрос #{sid} для примера; #{ids} остановлен."},
    "grammar.type": {"en": "the grammar must be text", "ru": "Грамматика должна быть текстом."},
    "grammar.kind": {"en": "the grammar box must start with «json:», «regex:», «ebnf:» or «choice:» (got «{got}»)",
                     "ru": "Поле грамматики должно начинаться с «json:», «regex:», «ebnf:» или «choice:» "
                           "(получено «{got}»)"},
    "grammar.bad": {"en": "{detail}", "ru": "Грамматика не принята: {detail}"},
    "name.temperature": {"en": "temperature", "ru": "температура"},
    "name.top_k": {"en": "top_k", "ru": "top-k"},
    "name.top_p": {"en": "top_p", "ru": "top-p"},
    "name.min_p": {"en": "min_p", "ru": "min-p"},
    "name.rep": {"en": "repetition penalty", "ru": "штраф за повтор"},
    "name.freq": {"en": "frequency penalty", "ru": "частотный штраф"},
    "name.pres": {"en": "presence penalty", "ru": "штраф за присутствие"},
    "name.seed": {"en": "seed", "ru": "сид"},
    "name.max_tokens": {"en": "max tokens", "ru": "макс. новых токенов"},
    "name.layer": {"en": "layer", "ru": "слой"},
    "name.head": {"en": "head", "ru": "голова"},
    "name.position": {"en": "position", "ru": "позиция"},
    "name.model": {"en": "model", "ru": "модель"},
    "name.gpu": {"en": "gpu", "ru": "GPU"},
    "name.dtype": {"en": "dtype", "ru": "тип данных"},
    "name.context": {"en": "context", "ru": "контекст"},
    "name.batch": {"en": "batch", "ru": "батч"},
    "name.k": {"en": "k", "ru": "k"},
    "name.alpha": {"en": "alpha", "ru": "α"},
    "name.draft_cost": {"en": "draft_cost", "ru": "стоимость черновика"},
    "name.reserve_fraction": {"en": "reserve_fraction", "ru": "доля резерва"},
    # ---- the whiteboard calculators' generated presets ----
    "calc.loaded": {"en": "{name} (loaded)", "ru": "{name} (загруженная)"},
    "calc.loaded_note": {"en": "The model running in this lab, with the numbers of its own ModelSpec.",
                         "ru": "Модель, которая работает в этой лаборатории, с числами её собственной спецификации."},
    "calc.machine": {"en": "This machine (measured)", "ru": "Эта машина (измерено)"},
    "calc.machine_note": {"en": "Read bandwidth and fp32 matmul speed measured at start-up; memory = total RAM.",
                          "ru": "Скорость чтения памяти и умножения матриц fp32 измерены при запуске; память — весь "
                                "объём ОЗУ."},
    # ---- the stage panels' titles and explanations (PANEL_KEYS gives their order) ----
    "panel.template.title": {"en": "1 · Chat template & tokens", "ru": "1 · Шаблон чата и токены"},
    "panel.template.text": {"en": "The model never sees your text as typed: the chat template wraps it in role "
                                  "markers (special tokens, highlighted), and byte-level BPE cuts the result into "
                                  "tokens. Hover a chip for its id and UTF-8 bytes; Cyrillic letters take two bytes "
                                  "each, so Russian text needs more tokens than English.",
                            "ru": "Модель не видит текст в том виде, как вы его набрали: шаблон чата оборачивает его "
                                  "служебными токенами ролей (подсвечены), а байтовый BPE режет результат на токены. "
                                  "Наведите на фишку — увидите id и байты UTF-8; кириллическая буква занимает два "
                                  "байта, поэтому русскому тексту нужно больше токенов."},
    "panel.embeddings.title": {"en": "2 · Embeddings", "ru": "2 · Эмбеддинги"},
    "panel.embeddings.text": {"en": "Each token id selects one row of the embedding matrix: a vector of the model's "
                                    "hidden size. The scatter projects this sequence's vectors to 2-D with PCA; the "
                                    "bars list the vocabulary entries whose vectors point the same way (cosine "
                                    "similarity) as the chosen token's.",
                              "ru": "Каждый id токена выбирает строку матрицы эмбеддингов — вектор размерности "
                                    "скрытого слоя. Точки — проекция векторов этой последовательности на плоскость "
                                    "(PCA); столбцы — токены словаря, чьи векторы ближе всего по косинусу к "
                                    "выбранному."},
    "panel.layers.title": {"en": "3 · Layers & attention", "ru": "3 · Слои и внимание"},
    "panel.layers.text": {"en": "In every layer each head decides how much each earlier token matters for the "
                                "current one. During prefill the whole triangle is computed at once, except rows "
                                "whose keys and values came from the prefix cache (a grey band: an earlier request "
                                "with the same beginning computed them); each decode step adds one row, reading the "
                                "older keys and values from the KV cache. The logit "
                                "lens applies the final norm and the output head to every layer's residual stream: "
                                "watch the answer form as depth grows (a token is written where it differs from the "
                                "layer below; hover a cell for the top 5).",
                          "ru": "В каждом слое каждая голова решает, насколько каждый предыдущий токен важен для "
                                "текущего. На префилле весь треугольник считается сразу, кроме строк, чьи ключи и "
                                "значения взяты из префиксного кэша (серая полоса: их посчитал более ранний запрос с "
                                "тем же началом); каждый шаг декодирования добавляет одну строку, читая старые "
                                "ключи и значения из KV-кэша. «Логит-линза» "
                                "применяет финальную нормализацию и выходную голову к остаточному потоку каждого "
                                "слоя — видно, как ответ складывается с глубиной (токен подписан там, где он "
                                "отличается от слоя ниже; наведите на клетку, чтобы увидеть топ-5)."},
    "panel.logits.title": {"en": "4 · Logits → softmax", "ru": "4 · Логиты → softmax"},
    "panel.logits.text": {"en": "The last layer's vector for the newest position is multiplied by the output matrix: "
                                "one score (logit) per vocabulary entry. Softmax turns scores into probabilities. "
                                "Entropy says how unsure the model is; perplexity summarises how surprising the kept "
                                "tokens were.",
                          "ru": "Вектор последнего слоя для новой позиции умножается на выходную матрицу — по одной "
                                "оценке (логиту) на каждый токен словаря. Softmax превращает оценки в вероятности. "
                                "Энтропия показывает неуверенность модели, перплексия — насколько неожиданными были "
                                "выбранные токены."},
    "panel.sampling.title": {"en": "5 · The sampling chain", "ru": "5 · Цепочка сэмплирования"},
    "panel.sampling.text": {"en": "Penalties, temperature, min-p, top-k and top-p run in this order, each cutting or "
                                  "reshaping the distribution (grey bars were removed; the rest is renormalised). "
                                  "Then a uniform random number u is drawn and the token where the cumulative "
                                  "distribution first exceeds u is chosen. Move a slider: the chain is recomputed "
                                  "from this step's logits with the same u, without rerunning the model.",
                            "ru": "Штрафы, температура, min-p, top-k и top-p применяются именно в таком порядке, "
                                  "каждый срезает или перекраивает распределение (серые столбцы отброшены, остальное "
                                  "перенормировано). Затем берётся случайное u, и выбирается токен, на котором "
                                  "накопленная вероятность впервые превышает u. Подвигайте ползунок — цепочка "
                                  "пересчитается по логитам этого шага с тем же u, без повторного прогона модели."},
    "panel.detok.title": {"en": "6 · Detokenizer & stream", "ru": "6 · Детокенизатор и поток"},
    "panel.detok.text": {"en": "Tokens are bytes, and one character can be split across tokens: the detokenizer "
                               "holds back an incomplete UTF-8 character instead of printing '�', and holds back "
                               "text that might be the start of a stop string. Held-back parts are shown in orange.",
                         "ru": "Токены — это байты, и один символ может оказаться разрезан между токенами: "
                               "детокенизатор придерживает неполный символ UTF-8 вместо вывода '�' и придерживает "
                               "текст, который может оказаться началом стоп-строки. Придержанное показано оранжевым."},
    "panel.kv.title": {"en": "7 · Paged KV cache", "ru": "7 · Страничный KV-кэш"},
    "panel.kv.text": {"en": "Keys and values of past tokens live in fixed-size blocks. Each sequence has a block "
                            "table mapping its logical blocks to physical ones; sequences with a common prefix share "
                            "blocks (refcount > 1), and finished blocks stay cached for reuse until evicted. A naive "
                            "allocator would reserve the whole maximum length per sequence up front.",
                      "ru": "Ключи и значения прошлых токенов хранятся в блоках фиксированного размера. У каждой "
                            "последовательности есть таблица блоков — отображение логических блоков в физические; "
                            "последовательности с общим префиксом делят блоки (счётчик ссылок > 1), а освободившиеся блоки "
                            "остаются в кэше до вытеснения. Наивный аллокатор сразу зарезервировал бы максимальную "
                            "длину."},
    "panel.timeline.title": {"en": "8 · Timeline & roofline", "ru": "8 · Хронология и roofline"},
    "panel.timeline.text": {"en": "Prefill processes many tokens in one pass and is limited by arithmetic; decode "
                                  "produces one token per sequence per pass and is limited by how fast the weights "
                                  "stream from memory. The roofline uses this machine's measured bandwidth and "
                                  "matmul speed; each step is a point. Times are engine time.",
                            "ru": "Префилл обрабатывает много токенов за проход и упирается в вычисления; "
                                  "декодирование даёт один токен на последовательность за проход и упирается в "
                                  "скорость чтения весов из памяти. Roofline построен по измеренной пропускной "
                                  "способности и скорости умножения матриц этой машины; каждый шаг — точка. Время — "
                                  "время работы движка."},
    "panel.speculative.title": {"en": "9 · Speculative decoding", "ru": "9 · Спекулятивное декодирование"},
    "panel.speculative.text": {"en": "A cheap drafter guesses k tokens; the model checks all of them in ONE forward "
                                     "pass. Each draft x is kept when a uniform u ≤ p(x)/q(x) (p: the model, q: the "
                                     "drafter); at the first rejection a token is drawn from the leftover max(p − q, "
                                     "0), and if all pass the model adds a bonus token. The output has exactly the "
                                     "model's distribution, yet one pass can yield up to k+1 tokens; rejected "
                                     "drafts' KV slots are rolled back.",
                               "ru": "Дешёвый черновик угадывает k токенов; модель проверяет их все за ОДИН проход. "
                                     "Токен x черновика принимается, если равномерное u ≤ p(x)/q(x) (p — модель, q — "
                                     "черновик); при первом отказе токен берётся из остатка max(p − q, 0), а если "
                                     "приняты все — модель добавляет бонусный токен. Выход имеет в точности "
                                     "распределение модели, но один проход даёт до k+1 токенов; KV-слоты отвергнутых "
                                     "токенов откатываются."},
    "panel.room.title": {"en": "10 · The room: one engine for everyone", "ru": "10 · Комната: один движок на всех"},
    "panel.room.text": {"en": "Every tab in this room talks to ONE engine. Each step batches the sequences of every "
                              "tab that is running into a single forward pass, so when everyone presses Run at once "
                              "the batches grow and the room's tokens per second rise while each tab's own speed "
                              "stays about the same. Sequences not in a step are held: they keep their KV blocks and "
                              "continue where they stopped. Tabs that share a prompt prefix (the same system prompt) "
                              "share its KV blocks; when the pool is full the engine preempts a sequence and "
                              "recomputes it later.",
                        "ru": "Все вкладки этой комнаты работают с ОДНИМ движком. Каждый шаг собирает "
                              "последовательности всех запущенных вкладок в один прямой проход: когда все разом "
                              "нажимают «Запуск», батчи растут, и токенов в секунду у комнаты становится больше, а "
                              "скорость каждой вкладки почти не меняется. Последовательности вне шага отложены: их "
                              "блоки KV сохраняются, и они продолжают с того же места. Вкладки с общим началом "
                              "запроса (одинаковый системный промпт) делят его блоки KV; когда пул заполнен, движок "
                              "вытесняет последовательность и позже пересчитывает её."},
    # ---- the whiteboard calculators (app/calculators.py) ----
    "calc.title": {"en": "Whiteboard calculators", "ru": "Калькуляторы «на доске»"},
    "calc.text": {"en": "The back-of-the-envelope arithmetic of serving, for well-known models and GPUs next to the "
                        "model running here. Every token of every sequence keeps 2 × layers × KV heads × head dim "
                        "values in the KV cache, so once the weights are loaded it is the KV cache that decides how "
                        "many conversations fit on a GPU. At small batch a decode step has to stream all the weights "
                        "from memory, so it takes at least bytes ÷ bandwidth — which is why quantisation speeds "
                        "decoding up. Speculative decoding buys several tokens per pass of the big model with a "
                        "cheap draft of k tokens.",
                  "ru": "Прикидки «на салфетке» для известных моделей и GPU рядом с моделью, которая работает здесь. "
                        "Каждый токен каждой последовательности хранит в KV-кэше 2 × слои × KV-головы × размерность "
                        "головы чисел, поэтому после загрузки весов именно KV-кэш решает, сколько диалогов "
                        "поместится на GPU. При маленьком батче шаг декодирования обязан прочитать из памяти все "
                        "веса, значит, он длится не меньше чем байты ÷ пропускная способность — поэтому квантизация "
                        "ускоряет декодирование. Спекулятивное декодирование за счёт дешёвого черновика из k токенов "
                        "получает несколько токенов за один проход большой модели."},
    "calc.label.model": {"en": "Model", "ru": "Модель"},
    "calc.label.dtype": {"en": "Data type of weights and KV cache", "ru": "Тип данных весов и KV-кэша"},
    "calc.label.context": {"en": "Context per sequence (tokens)", "ru": "Контекст последовательности (токенов)"},
    "calc.label.batch": {"en": "Batch (sequences decoded together)", "ru": "Батч (последовательностей за шаг)"},
    "calc.label.gpu": {"en": "GPU for the formulas and the roofline", "ru": "GPU для формул и roofline"},
    "calc.label.alpha": {"en": "Acceptance rate α", "ru": "Доля принятых токенов α"},
    "calc.label.k": {"en": "Draft length k", "ru": "Длина черновика k"},
    "calc.label.draft_cost": {"en": "Draft cost c (one draft token ÷ one target step)",
                              "ru": "Стоимость черновика c (токен черновика ÷ шаг основной модели)"},
    "calc_f.kv": {"en": "KV cache of the batch", "ru": "KV-кэш батча"},
    "calc_f.weights": {"en": "Weights in memory", "ru": "Веса в памяти"},
    "calc_f.fit": {"en": "Sequences that fit ({gpu})", "ru": "Сколько последовательностей поместится ({gpu})"},
    "calc_f.step": {"en": "Decode step lower bound ({gpu})", "ru": "Нижняя граница шага декодирования ({gpu})"},
    "calc_f.intensity": {"en": "Arithmetic intensity and the ridge point ({gpu})",
                         "ru": "Арифметическая интенсивность и точка перегиба ({gpu})"},
    "calc_f.spec": {"en": "Speculative decoding", "ru": "Спекулятивное декодирование"},
    "calc_f.live": {"en": "The live model as the engine holds it",
                    "ru": "Живая модель в том виде, как её хранит движок"},
    "calc_f.head_dim": {"en": "head dim", "ru": "размерность головы"},
    "calc_f.per_token": {"en": "per token", "ru": "на токен"},
    "calc_f.tps": {"en": "≤ {t} tokens/s per sequence, {tt} tokens/s for the batch",
                   "ru": "≤ {t} токенов/с на последовательность, {tt} токенов/с на батч"},
    "calc_f.no_batch": {"en": "a batch of {b} does not fit", "ru": "батч из {b} не помещается"},
    "calc_f.batch_ok": {"en": "a batch of {b} fits", "ru": "батч из {b} помещается"},
    "calc_f.mem_bound": {"en": "memory-bound: at most {pct}% of the compute peak is usable",
                         "ru": "упор в память: доступно не больше {pct}% пиковой производительности"},
    "calc_f.compute_bound": {"en": "compute-bound", "ru": "упор в вычисления"},
    "calc_f.decode1": {"en": "decode, batch 1", "ru": "декодирование, батч 1"},
    "calc_f.decodeb": {"en": "decode, batch {b}", "ru": "декодирование, батч {b}"},
    "calc_f.prefill": {"en": "prefill of {n}", "ru": "префилл из {n}"},
    "calc_f.e": {"en": "tokens per target pass", "ru": "токенов за проход основной модели"},
    "calc_f.speedup": {"en": "speedup", "ru": "ускорение"},
    "calc_f.live_line": {"en": "{name}: {dtype}, {w} of weights per step", "ru": "{name}: {dtype}, {w} весов за шаг"},
    "calc_f.measured": {"en": "measured", "ru": "измерено"},
    "calc_f.notes": {"en": "Assumptions: one device holds all the weights; {pct}% of its memory is kept for "
                           "activations, the runtime and fragmentation (vLLM's default gpu_memory_utilization is "
                           "0.9); every sequence keeps its whole context; the chosen dtype applies to weights and KV "
                           "cache alike (int4 scales ignored); the compute roof of a GPU is its dense bf16 tensor "
                           "peak; a decode step reads all weights except the untied input embedding table, of which "
                           "it gathers one row per token.",
                     "ru": "Допущения: все веса на одном устройстве; {pct}% памяти оставлено на активации, среду "
                           "выполнения и фрагментацию (в vLLM по умолчанию gpu_memory_utilization = 0,9); каждая "
                           "последовательность держит весь свой контекст; выбранный тип данных относится и к весам, "
                           "и к KV-кэшу (масштабы int4 не учтены); потолок вычислений GPU — пиковая "
                           "производительность bf16 на тензорных ядрах без разреженности; шаг декодирования читает "
                           "все веса, кроме отдельной входной таблицы эмбеддингов, из которой берётся по одной "
                           "строке на токен."},
    # a number's unit word: English (one, many), Russian (one, few, many) as in 1 слой, 2 слоя, 5 слоёв
    "calc_word.layers": {"en": ("layer", "layers"), "ru": ("слой", "слоя", "слоёв")},
    "calc_word.kv_heads": {"en": ("KV head", "KV heads"), "ru": ("KV-голова", "KV-головы", "KV-голов")},
    "calc_word.tokens": {"en": ("token", "tokens"), "ru": ("токен", "токена", "токенов")},
    "calc_word.seqs": {"en": ("sequence", "sequences"),
                       "ru": ("последовательность", "последовательности", "последовательностей")},
    "calc_word.bytes": {"en": ("byte", "bytes"), "ru": ("байт", "байта", "байт")},
    "calc_word.params": {"en": ("parameter", "parameters"), "ru": ("параметр", "параметра", "параметров")},
    # ---- the guided tour's notes on what a step ran (app/tour.py) ----
    "tour_note.none": {"en": "Nothing to run: look at the highlighted panel.",
                       "ru": "Запускать нечего: смотрите на подсвеченную панель."},
    "tour_note.start": {"en": "Started «{p}» ({mode}); max new tokens: {n}.",
                        "ru": "Запущен запрос «{p}» ({mode}); макс. новых токенов: {n}."},
    "tour_note.chat": {"en": "chat template", "ru": "шаблон чата"},
    "tour_note.plain": {"en": "plain text", "ru": "простой текст"},
    "tour_note.step": {"en": "Ran {done} engine step(s).", "ru": "Выполнено шагов движка: {done}."},
    "tour_note.step_short": {"en": "Ran {done} of {want} engine steps: every sequence has finished.",
                             "ru": "Выполнено шагов движка: {done} из {want} — все последовательности завершены."},
    "tour_note.add": {"en": "Queued request {sid}: «{p}» ({mode}). It is admitted at the next step.",
                      "ru": "В очередь добавлен запрос {sid}: «{p}» ({mode}). Он будет принят на следующем шаге."},
    "tour_note.run": {"en": "Ran {done} engine step(s) until every sequence finished.",
                      "ru": "Выполнено шагов движка: {done}; все последовательности завершены."},
    "tour_note.nothing": {"en": "Nothing left to run: every sequence has finished.",
                          "ru": "Делать больше нечего: все последовательности завершены."},
    "tour_note.speculate": {"en": "Started «{p}» with an early-exit drafter (the first {layer} layers, k = {k}) at "
                                  "temperature 0 and ran {done} engine step(s); your own speculative setting is "
                                  "unchanged.",
                            "ru": "Запущен запрос «{p}» с черновиком раннего выхода (первые {layer} слоёв, k = {k}) "
                                  "при температуре 0; выполнено шагов движка: {done}. Ваша настройка "
                                  "спекулятивного декодирования не изменилась."},
    # ---- the charts and panels (app/charts/*, app/panels/*): one section per module ----
    # app/charts/attention.py
    "attn.attn_title": {"en": "Attention · layer {layer}, head {head}",
                        "ru": "Внимание · слой {layer}, голова {head}"},
    "attn.attn_empty": {"en": "Nothing captured yet for this sequence. Press Step",
                        "ru": "Для этой последовательности пока ничего не записано. Нажмите «Шаг»"},
    "attn.attn_no_layer": {"en": "Layer {layer}, head {head} was not captured for this sequence",
                           "ru": "Слой {layer}, голова {head} не записаны для этой последовательности"},
    "attn.window": {"en": " (last {n} of {total} positions)", "ru": " (последние {n} из {total} позиций)"},
    "attn.query": {"en": "Query", "ru": "Запрос"},
    "attn.key": {"en": "Key", "ru": "Ключ"},
    "attn.weight": {"en": "weight", "ru": "вес"},
    "attn.x_key": {"en": "Key token (attended to)", "ru": "Токен-ключ (на который смотрят)"},
    "attn.y_query": {"en": "Query token (attending)", "ru": "Токен-запрос (который смотрит)"},
    "attn.grid_title": {"en": "All heads · layer {layer}", "ru": "Все головы · слой {layer}"},
    "attn.head": {"en": "head", "ru": "голова"},
    "attn.layer": {"en": "layer", "ru": "слой"},
    "attn.entropy_title": {"en": "Attention entropy of the newest query<br><span "
                                 "style='font-size:11px;color:#555'>position {pos}, {ctx} keys; uniform = {max:.2f} "
                                 "bits</span>",
                           "ru": "Энтропия внимания последнего запроса<br><span "
                                 "style='font-size:11px;color:#555'>позиция {pos}, ключей: {ctx}; равномерно = "
                                 "{max:.2f} бит</span>"},
    "attn.entropy_name": {"en": "Attention entropy per head", "ru": "Энтропия внимания по головам"},
    "attn.entropy_empty": {"en": "Nothing captured yet for this sequence. Press Step",
                           "ru": "Для этой последовательности пока ничего не записано. Нажмите «Шаг»"},
    "attn.bits": {"en": "bits", "ru": "бит"},
    "attn.x_head": {"en": "Head", "ru": "Голова"},
    "attn.y_layer": {"en": "Layer", "ru": "Слой"},
    "attn.lens_title": {"en": "Logit lens · top-1 next token after each layer (written where it changes)",
                        "ru": "Логит-линза · самый вероятный следующий токен после каждого слоя (подписан там, где он "
                              "меняется)"},
    "attn.lens_empty": {"en": "Nothing captured yet for this sequence. Press Step (in a busy room each tab's steps "
                              "are captured in turn)",
                        "ru": "Для этой последовательности пока ничего не записано. Нажмите «Шаг» (в занятой комнате "
                              "шаги вкладок записываются по очереди)"},
    "attn.top1": {"en": "top-1 prob", "ru": "вер. top-1"},
    "attn.position": {"en": "position", "ru": "позиция"},
    "attn.x_position": {"en": "Position (input token)", "ru": "Позиция (входной токен)"},
    "attn.y_lens_layer": {"en": "Layer (residual stream after it)", "ru": "Слой (остаточный поток после него)"},
    "attn.input": {"en": "input", "ru": "вход"},
    "attn.next": {"en": "actual next", "ru": "настоящий следующий"},
    "attn.kept_last": {"en": "attention kept for the last {k} of the {total} positions shown",
                       "ru": "внимание сохранено для последних {k} из {total} показанных позиций"},
    "attn.kept_some": {"en": "attention kept for {k} of the {total} positions shown",
                       "ru": "внимание сохранено для {k} из {total} показанных позиций"},
    "attn.kept_none": {"en": "no attention kept for the {total} positions shown",
                       "ru": "внимание не сохранено ни для одной из {total} показанных позиций"},
    "attn.over_budget": {"en": "{n} over the capture budget ({budget} a step)",
                         "ru": "{n} — сверх бюджета захвата ({budget} на шаг)"},
    "attn.freed": {"en": "{n} freed later (capture budget)", "ru": "{n} удалены позже (бюджет захвата)"},
    "attn.not_kept": {"en": "Attention of layer {layer} was not kept for these positions (capture budget)",
                      "ru": "Внимание слоя {layer} для этих позиций не сохранено (бюджет захвата)"},
    "attn.not_kept_any": {"en": "Attention was not kept for these positions (capture budget)",
                          "ru": "Внимание для этих позиций не сохранено (бюджет захвата)"},
    "attn.entropy_older": {"en": "attention of the {n} newer positions not kept (capture budget)",
                           "ru": "внимание {n} более новых позиций не сохранено (бюджет захвата)"},
    "attn.lens_freed": {"en": "logit lens of {n} positions not kept (capture budget)",
                        "ru": "логит-линза для {n} позиций не сохранена (бюджет захвата)"},
    "attn.uncaptured": {"en": "{n} not captured (another sequence in focus, or a busy room capturing tabs in turn)",
                        "ru": "{n} не записаны (в фокусе была другая последовательность или комната занята и "
                              "записывает вкладки по очереди)"},
    "attn.not_captured": {"en": "These steps were not captured: another sequence was in focus, or the room was busy "
                                "and captured other tabs' steps (each tab's in turn). Press Step",
                          "ru": "Эти шаги не записаны: в фокусе была другая последовательность, или комната была "
                                "занята и записывала шаги других вкладок (по очереди). Нажмите «Шаг»"},
    # the longest run of empty rows of the heatmap, labelled inside it (charts/attention.py gap_label)
    "attn.gap_over": {"en": "rows {first}–{last}: computed, not kept<br>(capture budget: {budget} a step keeps the "
                            "last rows)",
                      "ru": "строки {first}–{last}: вычислены, но не сохранены<br>(бюджет захвата: {budget} на шаг "
                            "— сохраняются последние строки)"},
    "attn.gap_freed": {"en": "rows {first}–{last}: freed later<br>(capture budget of this tab)",
                       "ru": "строки {first}–{last}: удалены позже<br>(бюджет захвата вкладки)"},
    "attn.gap_uncaptured": {"en": "rows {first}–{last}: not captured<br>(another sequence in focus, or a busy room)",
                            "ru": "строки {first}–{last}: не записаны<br>(в фокусе была другая последовательность "
                                  "или комната занята)"},
    # the prefix cache's rows: their K/V were reused from an earlier request, so no attention row was computed
    "attn.cached_name": {"en": "prefix cache", "ru": "префиксный кэш"},
    "attn.cached_label": {"en": "rows {first}–{last}: prefix cache<br>K/V reused, not computed this time",
                          "ru": "строки {first}–{last}: из префиксного кэша<br>K/V взяты готовыми, сейчас не считались"},
    "attn.cached_hover": {"en": "from the prefix cache: an earlier request computed positions {first}–{last}; their "
                                "keys and values were reused, so this row was never computed for this sequence",
                          "ru": "из префиксного кэша: позиции {first}–{last} посчитал более ранний запрос; их ключи "
                                "и значения взяты готовыми, поэтому эта строка для этой последовательности не "
                                "вычислялась"},
    "attn.cached_note": {"en": "rows {first}–{last}: from the prefix cache, not computed this time",
                         "ru": "строки {first}–{last}: из префиксного кэша, сейчас не вычислялись"},
    # app/charts/calculators.py
    "calc_chart.kv_title": {"en": "KV cache per token (left axis) and per sequence of {ctx} tokens (right axis)",
                            "ru": "KV-кэш на токен (слева) и на посл. из {ctx} ток. (справа)"},
    "calc_chart.per_token": {"en": "per token", "ru": "на токен"},
    "calc_chart.per_seq": {"en": "per sequence ({ctx} tokens)", "ru": "на последовательность ({ctx} ток.)"},
    "calc_chart.kv_hover": {"en": "<b>{model}</b> · {dtype}<br>{tok} per token<br>{seq} per sequence of {ctx} "
                                  "tokens<br>{batch} for a batch of {b}",
                            "ru": "<b>{model}</b> · {dtype}<br>{tok} на токен<br>{seq} на последовательность из "
                                  "{ctx} токенов<br>{batch} на батч из {b}"},
    "calc_chart.fit_title": {"en": "{model} in {dtype}, {ctx}-token context: how many sequences fit beside the "
                                   "weights",
                             "ru": "Сколько поместится: {model}, {dtype}, контекст {ctx}"},
    "calc_chart.gib": {"en": "memory (GiB)", "ru": "память (ГиБ)"},
    "calc_chart.weights": {"en": "weights", "ru": "веса"},
    "calc_chart.reserve": {"en": "reserve ({pct}% for activations, runtime, fragmentation)",
                           "ru": "резерв ({pct}% на активации, среду выполнения, фрагментацию)"},
    "calc_chart.kv": {"en": "KV cache of the sequences that fit", "ru": "KV-кэш поместившихся последовательностей"},
    "calc_chart.unused": {"en": "left over (less than one sequence)",
                          "ru": "остаток (меньше одной последовательности)"},
    "calc_chart.capacity": {"en": "capacity", "ru": "объём"},
    "calc_chart.fit_n": {"en": "{n} seq.", "ru": "{n} посл."},
    "calc_chart.no_fit": {"en": "weights do not fit", "ru": "веса не помещаются"},
    "calc_chart.no_kv": {"en": "no room for KV", "ru": "нет места под KV"},
    "calc_chart.fit_hover": {"en": "<b>{gpu}</b><br>capacity {mem}<br>weights {w}<br>reserve {r}<br>left for KV "
                                   "{free}<br>KV per sequence {kv}<br><b>{n} sequences</b>",
                             "ru": "<b>{gpu}</b><br>объём {mem}<br>веса {w}<br>резерв {r}<br>остаётся под KV "
                                   "{free}<br>KV на последовательность {kv}<br><b>последовательностей: {n}</b>"},
    "calc_chart.step_title": {"en": "Decode step lower bound: (weights + KV read) / bandwidth, batch {b}, "
                                    "{ctx}-token context",
                              "ru": "Нижняя граница шага декодирования, батч {b}, {ctx} ток."},
    "calc_chart.ms": {"en": "ms per decode step (log)", "ru": "мс на шаг декодирования (лог.)"},
    "calc_chart.step_hover": {"en": "<b>{gpu}</b> · {dtype}<br>weights {w} + KV read {kv} = {tot}<br>÷ {bw} = "
                                    "<b>{t}</b><br>≤ {tps} tokens/s per sequence",
                              "ru": "<b>{gpu}</b> · {dtype}<br>веса {w} + чтение KV {kv} = {tot}<br>÷ {bw} = "
                                    "<b>{t}</b><br>≤ {tps} токенов/с на последовательность"},
    "calc_chart.no_room": {"en": "does not fit in memory", "ru": "не помещается в памяти"},
    "calc_chart.roof_title": {"en": "Roofline of {gpu} ({dtype}): where decode and prefill sit",
                              "ru": "Roofline {gpu} ({dtype}): декодирование и префилл"},
    "calc_chart.x": {"en": "arithmetic intensity (FLOP / byte moved)",
                     "ru": "арифметическая интенсивность (флоп / байт)"},
    "calc_chart.y": {"en": "attainable FLOP/s", "ru": "достижимые флоп/с"},
    "calc_chart.roof": {"en": "roof = min(peak, bandwidth × intensity)",
                        "ru": "крыша = min(пик, пропускная способность × интенсивность)"},
    "calc_chart.ridge": {"en": "ridge {r} FLOP/B", "ru": "перегиб {r} флоп/Б"},
    "calc_chart.decode_b": {"en": "decode, batch {b}", "ru": "декодирование, батч {b}"},
    "calc_chart.prefill_n": {"en": "prefill, {n}", "ru": "префилл, {n}"},
    "calc_chart.decode_dtypes": {"en": "decode, batch 1, other dtypes", "ru": "декодирование, батч 1, другие типы"},
    "calc_chart.left_to_right": {"en": "left to right {names}", "ru": "слева направо {names}"},
    "calc_chart.pt_hover": {"en": "<b>{name}</b><br>{flops} over {bytes}<br>intensity {i} FLOP/B<br>attainable "
                                  "{att} ({bound})",
                            "ru": "<b>{name}</b><br>{flops} на {bytes}<br>интенсивность {i} флоп/Б<br>достижимо "
                                  "{att} ({bound})"},
    "calc_chart.mem_bound": {"en": "memory-bound", "ru": "упор в память"},
    "calc_chart.compute_bound": {"en": "compute-bound", "ru": "упор в вычисления"},
    "calc_chart.spec_title": {"en": "Speculative decoding, draft cost c = {c}: speedup over α (left) and over α × k "
                                    "(right)",
                              "ru": "Спекулятивное декодирование, стоимость черновика c = {c}: ускорение по α "
                                    "(слева) и по α × k (справа)"},
    "calc_chart.alpha": {"en": "acceptance rate α", "ru": "доля принятых α"},
    "calc_chart.speedup": {"en": "speedup E / (1 + k·c)", "ru": "ускорение E/(1+k·c)"},
    "calc_chart.k": {"en": "draft length k", "ru": "длина k"},
    "calc_chart.line_k": {"en": "k = {k}", "ru": "k = {k}"},
    "calc_chart.e_line": {"en": "E tokens per pass, k = {k}", "ru": "E токенов за проход, k = {k}"},
    "calc_chart.breakeven": {"en": "no gain (speedup 1)", "ru": "без выигрыша (ускорение 1)"},
    "calc_chart.spec_hover": {"en": "α = %{x:.2f} · k = {k}<br>speedup %{y:.3f}×<extra></extra>",
                              "ru": "α = %{x:.2f} · k = {k}<br>ускорение %{y:.3f}×<extra></extra>"},
    "calc_chart.heat_hover": {"en": "α = %{x:.2f} · k = %{y}<br>speedup %{z:.3f}×<extra></extra>",
                              "ru": "α = %{x:.2f} · k = %{y}<br>ускорение %{z:.3f}×<extra></extra>"},
    "calc_chart.chosen": {"en": "α = {a}, k = {k}: E = {e}, speedup {s}×",
                          "ru": "α = {a}, k = {k}: E = {e}, ускорение {s}×"},
    "calc_chart.no_data": {"en": "No data for this choice.", "ru": "Для такого выбора данных нет."},
    # app/charts/detok.py
    "detok.title": {"en": "Detokenizer: the last {n} tokens of sequence {seq}",
                    "ru": "Детокенизатор: последние {n} токенов последовательности {seq}"},
    "detok.empty_title": {"en": "Detokenizer", "ru": "Детокенизатор"},
    "detok.empty": {"en": "No token sampled for this sequence yet: press Step.",
                    "ru": "Для этой последовательности токен ещё не выбран: нажмите «Шаг»."},
    "detok.cols": {"en": ["step", "token id", "token", "bytes (hex)", "emitted text", "held back", "stop string"],
                   "ru": ["шаг", "id токена", "токен", "байты (hex)", "выданный текст", "придержано", "стоп-строка"]},
    "detok.matched": {"en": "matched", "ru": "совпала"},
    "detok.forced": {"en": "(forced)", "ru": "(навязан)"},
    # no-break spaces keep "step · i/k" on one line of a wrapped title
    "detok.rounds_note": {"en": " · in a speculative round, step\u00a0·\u00a0i/k is its i-th of k tokens",
                          "ru": " · в спекулятивном раунде шаг\u00a0·\u00a0i/k — его i-й из k токенов"},
    # app/charts/embeddings.py
    "emb.pca_title": {"en": "Input embeddings of the sequence, PCA to 2-D ({n} tokens)",
                      "ru": "Входные эмбеддинги последовательности, PCA в 2-D (токенов: {n})"},
    "emb.pca_labels": {"en": "labels: the newest {k} tokens; hover a point for any token",
                       "ru": "подписано последних токенов: {k}; наведите на точку, чтобы увидеть любой"},
    "emb.pca_empty": {"en": "Nothing captured yet for this sequence. Press Step (in a busy room each tab's steps "
                            "are captured in turn)",
                      "ru": "Для этой последовательности пока ничего не записано. Нажмите «Шаг» (в занятой комнате "
                            "шаги вкладок записываются по очереди)"},
    "emb.pc": {"en": "PC{k} ({pct:.1f}% of variance)", "ru": "ГК{k} ({pct:.1f}% дисперсии)"},
    "emb.prompt": {"en": "prompt", "ru": "промпт"},
    "emb.generated": {"en": "generated", "ru": "сгенерировано"},
    "emb.position": {"en": "position", "ru": "позиция"},
    "emb.nb_title": {"en": "Nearest tokens to {tok} (cosine of input embeddings)",
                     "ru": "Ближайшие к {tok} токены (косинус входных эмбеддингов)"},
    "emb.nb_empty": {"en": "Pick a token to see its nearest neighbours in the embedding table",
                     "ru": "Выберите токен, чтобы увидеть его ближайших соседей в таблице эмбеддингов"},
    "emb.cosine": {"en": "Cosine similarity", "ru": "Косинусное сходство"},
    "emb.token": {"en": "Token", "ru": "Токен"},
    "emb.freed": {"en": "embeddings of {n} positions not kept (capture budget)",
                  "ru": "эмбеддинги {n} позиций не сохранены (бюджет захвата)"},
    # app/charts/kv_cache.py
    "kv.pool": {"en": "KV block pool", "ru": "Пул блоков KV"},
    "kv.pool_title": {"en": "KV block pool: {used} used · {cached} cached · {free} free of {n} blocks × {bs} tokens",
                      "ru": "Пул блоков KV: {used} занято · {cached} в кэше · {free} свободно из {n} блоков × {bs} "
                            "токенов"},
    "kv.no_event": {"en": "Step the engine to see the KV block pool.",
                    "ru": "Сделайте шаг, чтобы увидеть пул блоков KV."},
    "kv.state": {"en": {"used": "used", "cached": "cached", "free": "free"},
                 "ru": {"used": "занят", "cached": "в кэше", "free": "свободен"}},
    "kv.legend_cached": {"en": "cached (free, prefix kept)", "ru": "в кэше (свободен, префикс сохранён)"},
    "kv.not_drawn": {"en": "+ {k:,} more free blocks, {first}–{last}, not drawn",
                     "ru": "+ ещё {k:,} свободных блоков, {first}–{last}, не показаны"},
    "kv.seq": {"en": "seq", "ru": "посл."},
    "kv.block": {"en": "block", "ru": "блок"},
    "kv.refcount": {"en": "refcount", "ru": "ссылок"},
    "kv.owners": {"en": "owners", "ru": "владельцы"},
    "kv.hashed": {"en": "hashed (full, reusable prefix)", "ru": "хеширован (полный, переиспользуемый префикс)"},
    "kv.yes": {"en": "yes", "ru": "да"},
    "kv.no": {"en": "no", "ru": "нет"},
    "kv.col": {"en": "block id mod 32", "ru": "номер блока mod 32"},
    "kv.row": {"en": "blocks", "ru": "блоки"},
    "kv.tables": {"en": "Block tables", "ru": "Таблицы блоков"},
    "kv.tables_title": {"en": "Block tables: logical block → physical block",
                        "ru": "Таблицы блоков: логический блок → физический блок"},
    "kv.no_tables": {"en": "No sequence holds KV blocks right now.",
                     "ru": "Сейчас ни одна последовательность не держит блоков KV."},
    "kv.logical": {"en": "logical block", "ru": "логический блок"},
    "kv.logical_axis": {"en": "logical block i (holds tokens i·{bs} … i·{bs}+{last})",
                        "ru": "логический блок i (токены i·{bs} … i·{bs}+{last})"},
    "kv.tokens": {"en": "tokens", "ru": "токены"},
    "kv.logical_axis_wrapped": {"en": "logical block = row start + column",
                                "ru": "логический блок = начало строки + столбец"},
    "kv.shared_by": {"en": "shared by seqs", "ru": "общий для посл."},
    "kv.memory": {"en": "KV memory", "ru": "Память KV"},
    "kv.memory_title": {"en": "KV memory: paged pool vs a naive contiguous allocator",
                        "ru": "Память KV: страничный пул и наивное выделение"},
    "kv.rows": {"en": ["paged pool", "paged: used blocks", "naive contiguous"],
                "ru": ["страничный пул", "занятые блоки", "наивный"]},
    "kv.used": {"en": "used blocks", "ru": "занятые блоки"},
    "kv.cached": {"en": "cached (reusable prefix)", "ru": "в кэше (префиксы)"},
    "kv.free_": {"en": "free", "ru": "свободно"},
    "kv.stored": {"en": "tokens stored (paged: shared prefixes once)",
                  "ru": "хранимые токены (страничный: общий префикс один раз)"},
    "kv.paged_waste": {"en": "paged: unused slots in last blocks", "ru": "страничный: пустые слоты последних блоков"},
    "kv.naive_waste": {"en": "naive: reserved for max_tokens, unused",
                       "ru": "наивный: зарезервировано под max_tokens, не занято"},
    "kv.pool_size": {"en": "pool size", "ru": "размер пула"},
    "kv.bytes": {"en": "bytes", "ru": "байты"},
    # app/charts/logits.py
    "logits.title": {"en": "Next token: raw logits and probabilities",
                     "ru": "Следующий токен: сырые логиты и вероятности"},
    "logits.empty": {"en": "Step the engine to see the next-token logits",
                     "ru": "Сделайте шаг движка, чтобы увидеть логиты следующего токена"},
    "logits.stats": {"en": "entropy {nats:.2f} nats = {bits:.2f} bits",
                     "ru": "энтропия {nats:.2f} нат = {bits:.2f} бит"},
    "logits.chosen": {"en": "chosen {tok}: rank {rank}, p = {p:.3f}", "ru": "выбран {tok}: ранг {rank}, p = {p:.3f}"},
    # a forced token (issue 13, item 3): it was emitted; the draw's own pick is what it "would have sampled"
    "logits.forced_line": {"en": "forced {tok} (id {id}) was emitted: rank {rank}, p = {p}",
                           "ru": "выдан навязанный {tok} (id {id}): ранг {rank}, p = {p}"},
    "logits.not_shown": {"en": " (not among the tokens shown)", "ru": " (нет среди показанных токенов)"},
    "logits.would": {"en": "the draw would have sampled {tok}: rank {rank}, p = {p:.3f}",
                     "ru": "розыгрыш выбрал бы {tok}: ранг {rank}, p = {p:.3f}"},
    "logits.key_forced": {"en": "forced (emitted)", "ru": "навязан (выдан)"},
    "logits.key_masked": {"en": " · ⊘ masked by the grammar", "ru": " · ⊘ отсечён грамматикой"},
    "logits.key_masked_legend": {"en": "⊘ masked by the grammar", "ru": "⊘ отсечён грамматикой"},
    "logits.key_would": {"en": "would have sampled", "ru": "выбрал бы розыгрыш"},
    "logits.key_sampled": {"en": "sampled", "ru": "выбран"},
    "logits.logit": {"en": "Logit (raw)", "ru": "Логит (сырой)"},
    "logits.prob": {"en": "Probability", "ru": "Вероятность"},
    "logits.softmax": {"en": "softmax(logits)", "ru": "softmax(логиты)"},
    "logits.final": {"en": "after sampling chain", "ru": "после цепочки сэмплинга"},
    # the units (issue 13, item 13): log p in nats; perplexity is per token, over the tokens so far
    "logits.ppl_title": {"en": "Log-probability of each generated token (nats) · perplexity {ppl:.2f} per token, "
                               "over {n} tokens",
                         "ru": "Лог-вероятности токенов ответа (наты) · перплексия {ppl:.2f} на токен, "
                               "по {n} ток."},
    "logits.ppl_name": {"en": "Log-probability and perplexity", "ru": "Лог-вероятности и перплексия"},
    "logits.ppl_empty": {"en": "Generate a few tokens to see their log-probabilities and perplexity",
                         "ru": "Сгенерируйте несколько токенов, чтобы увидеть их лог-вероятности и перплексию"},
    "logits.bits": {"en": "bits", "ru": "бит"},
    "logits.logprob": {"en": "log p(token)", "ru": "log p(токен)"},
    "logits.expected": {"en": "expected log p (−entropy)", "ru": "ожидаемый log p (−энтропия)"},
    "logits.running": {"en": "running perplexity", "ru": "накопленная перплексия"},
    "logits.x": {"en": "Generated token", "ru": "Сгенерированный токен"},
    "logits.y": {"en": "nats", "ru": "наты"},
    "logits.y2": {"en": "Perplexity (per token)", "ru": "Перплексия (на токен)"},
    "logits.entropy": {"en": "entropy", "ru": "энтропия"},
    # app/charts/sampling.py
    "sampling.chain": {"en": "Sampling chain", "ru": "Цепочка сэмплирования"},
    # the chain's stages, named like engine/sampling.py's (the names stay the trace's own)
    "sampling.stage_names": {"en": {"logits": "logits", "grammar": "grammar", "bias": "bias", "penalties": "penalties",
                                    "temperature": "temperature", "min_p": "min_p", "top_k": "top_k", "top_p": "top_p"},
                             "ru": {"logits": "логиты", "grammar": "грамматика", "bias": "смещение", "penalties": "штрафы",
                                    "temperature": "температура", "min_p": "min-p", "top_k": "top-k", "top_p": "top-p"}},
    # constrained decoding (issue 15): the grammar stage's line under the chain's title, the CDF's note
    "sampling.grammar_line": {"en": "grammar: {allowed:,} of {vocab:,} tokens allowed · {masked} of the {n} shown "
                                    "masked · −{mass:.1%} of the mass · mask {ms:.2f} ms",
                              "ru": "грамматика: разрешено {allowed:,} из {vocab:,} токенов · {masked} из {n} "
                                    "показанных отсечены · −{mass:.1%} массы · маска {ms:.2f} мс"},
    # vLLM's request extras (logit_bias, allowed_token_ids, bad_words, min_tokens): the bias stage's line
    "sampling.bias_line": {"en": "bias: {allowed:,} of {vocab:,} tokens left · of the {n} shown {banned} banned, "
                                 "{down} pushed down, {up} up",
                           "ru": "смещение: осталось {allowed:,} из {vocab:,} токенов · из {n} показанных {banned} "
                                 "запрещены, {down} понижены, {up} повышены"},
    "sampling.cdf_masked": {"en": "masked by the grammar, not in the draw: {n} of the top tokens ({names})",
                            "ru": "отсечены грамматикой и не участвуют в выборе: {n} из топ-токенов ({names})"},
    "sampling.logit": {"en": "logit", "ru": "логит"},
    "sampling.slice": {"en": "slice", "ru": "отрезок"},
    "sampling.chain_title": {"en": "Sampling chain → «{tok}» (p = {p:.3f}, raw rank {rank})",
                             "ru": "Цепочка сэмплирования → «{tok}» (p = {p:.3f}, ранг по логитам {rank})"},
    "sampling.what_if": {"en": "what-if (not applied until the next step)",
                         "ru": "что-если (применится только со следующего шага)"},
    "sampling.what_if_badge": {"en": "WHAT-IF", "ru": "ЧТО-ЕСЛИ"},
    "sampling.no_trace": {"en": "Step the engine: the sampling chain appears once a token is sampled.",
                          "ru": "Сделайте шаг: цепочка появится, когда будет выбран токен."},
    "sampling.off": {"en": "off", "ru": "выкл."},
    "sampling.kept": {"en": "kept", "ru": "оставлен"},
    "sampling.removed": {"en": "removed", "ru": "отсечён"},
    "sampling.prob": {"en": "probability", "ru": "вероятность"},
    "sampling.removed_mass": {"en": "removed", "ru": "отсечено"},
    "sampling.cdf": {"en": "Inverse-CDF draw", "ru": "Выбор по обратной CDF"},
    "sampling.cdf_title": {"en": "Inverse-CDF draw: u = {u:.4f} → «{tok}» (p = {p:.3f})",
                           "ru": "Выбор по обратной CDF: u = {u:.4f} → «{tok}» (p = {p:.3f})"},
    "sampling.greedy": {"en": "temperature 0: argmax, no draw", "ru": "температура 0: argmax, без розыгрыша"},
    "sampling.greedy_title": {"en": "Greedy: «{tok}» (temperature 0: argmax, no draw)",
                              "ru": "Жадно: «{tok}» (температура 0: argmax, без розыгрыша)"},
    "sampling.cum": {"en": "cumulative probability", "ru": "накопленная вероятность"},
    "sampling.draw_order": {"en": "surviving tokens in draw order (most probable first)",
                            "ru": "оставшиеся токены по порядку розыгрыша (вероятные первыми)"},
    "sampling.tail": {"en": "{m:.1%} of the mass lies in untracked tokens",
                      "ru": "{m:.1%} массы приходится на неотслеживаемые токены"},
    "sampling.chosen": {"en": "chosen", "ru": "выбран"},
    # a forced token (issue 13, item 3): emitted instead of the draw's pick, which it "would have sampled"
    "sampling.forced": {"en": "forced: emitted instead of the draw's pick",
                        "ru": "навязан: выдан вместо выбора розыгрыша"},
    "sampling.would": {"en": "would have sampled (the token was forced)",
                       "ru": "выбрал бы розыгрыш (токен был навязан)"},
    "sampling.chain_title_forced": {"en": "Sampling chain · forced «{forced}» was emitted<br>the draw would have "
                                          "sampled «{tok}» (p = {p:.3f}, raw rank {rank})",
                                    "ru": "Цепочка сэмплирования · выдан навязанный «{forced}»<br>розыгрыш выбрал "
                                          "бы «{tok}» (p = {p:.3f}, ранг по логитам {rank})"},
    "sampling.forced_title": {"en": "Forced «{tok}» was emitted", "ru": "Выдан навязанный «{tok}»"},
    "sampling.forced_mark": {"en": "forced", "ru": "навязан"},
    "sampling.forced_outside": {"en": "forced «{tok}» is not in the draw (cut by the chain or untracked)",
                                "ru": "навязанного «{tok}» нет в розыгрыше (отсечён цепочкой или не отслеживается)"},
    "sampling.cdf_title_would": {"en": "Inverse-CDF draw: u = {u:.4f} would have sampled «{tok}» (p = {p:.3f})",
                                 "ru": "Выбор по обратной CDF: u = {u:.4f} выбрал бы «{tok}» (p = {p:.3f})"},
    "sampling.greedy_title_would": {"en": "Greedy: the argmax «{tok}» would have been emitted",
                                    "ru": "Жадно: был бы выдан argmax «{tok}»"},
    "sampling.stage": {"en": "stage", "ru": "этап"},
    "sampling.tokens_axis": {"en": "tracked tokens (top by logit + the chosen one)",
                             "ru": "отслеживаемые токены (лучшие по логиту + выбранный)"},
    "sampling.stage_hover": {"en": "{name}: {kept:,} of {vocab:,} tokens kept; {removed:.1%} of the probability mass "
                                   "removed",
                             "ru": "{name}: осталось {kept:,} из {vocab:,} токенов; убрано {removed:.1%} "
                                   "вероятностной массы"},
    # app/charts/speculative.py
    "spec.rounds": {"en": "Speculative rounds", "ru": "Раунды спекулятивного декодирования"},
    "spec.rounds_title": {"en": "Speculative rounds: {n} rounds, {acc}/{drafted} drafts accepted, {tok} tokens",
                          "ru": "Раунды: {n}, принято черновиков {acc}/{drafted}, токенов {tok}"},
    "spec.no_rounds": {"en": "Start a request with speculative decoding and step the engine to see its rounds.",
                       "ru": "Запустите запрос со спекулятивным декодированием и сделайте шаг, чтобы увидеть раунды."},
    "spec.round": {"en": "round (decode step)", "ru": "раунд (шаг декодирования)"},
    "spec.slot": {"en": "position in the round", "ru": "позиция в раунде"},
    "spec.kinds": {"en": {"accepted": "draft accepted",
                          "rejected": "draft rejected",
                          "unchecked": "draft not checked",
                          "bonus": "bonus token (all accepted, drawn from p)",
                          "resampled": "resampled from norm(max(p − q, 0))",
                          "sampled": "no drafts: sampled as usual",
                          "forced": "forced token"},
                   "ru": {"accepted": "черновик принят",
                          "rejected": "черновик отклонён",
                          "unchecked": "черновик не проверялся",
                          "bonus": "бонусный токен (все приняты, из p)",
                          "resampled": "перевыбран из norm(max(p − q, 0))",
                          "sampled": "без черновиков: обычный выбор",
                          "forced": "навязанный токен"}},
    "spec.step": {"en": "step", "ru": "шаг"},
    "spec.token": {"en": "token", "ru": "токен"},
    "spec.dropped": {"en": "dropped (stop/EOS/max_tokens cut the round)",
                     "ru": "отброшен (стоп/EOS/max_tokens оборвали раунд)"},
    "spec.pq": {"en": "p vs q", "ru": "p и q"},
    "spec.pq_title": {"en": "Round at step {step}: target p vs draft q at each drafted position",
                      "ru": "Раунд на шаге {step}: p целевой модели и q черновика по позициям"},
    "spec.pq_title_nostep": {"en": "Target p vs draft q at each drafted position",
                             "ru": "p целевой модели и q черновика по позициям"},
    "spec.no_pq": {"en": "No drafts verified in this round (no n-gram match, or the last token of max_tokens).",
                   "ru": "В этом раунде нечего проверять (нет совпадения n-граммы или это последний токен "
                         "max_tokens)."},
    "spec.no_dists": {"en": "Probabilities per position are recorded in traced steps (Step button), not in Run.",
                      "ru": "Вероятности по позициям записываются в трассируемых шагах (кнопка «Шаг»), не в "
                            "«Запуске»."},
    "spec.pos": {"en": "pos {i}", "ru": "поз. {i}"},
    "spec.draft": {"en": "draft", "ru": "черновик"},
    "spec.bonus_pos": {"en": "bonus", "ru": "бонус"},
    "spec.p": {"en": "p (target)", "ru": "p (целевая)"},
    "spec.q": {"en": "q (draft)", "ru": "q (черновик)"},
    "spec.residual": {"en": "residual norm(max(p − q, 0))", "ru": "остаток norm(max(p − q, 0))"},
    "spec.verdict": {"en": {"accepted": "accepted", "rejected": "rejected", "unchecked": "not checked"},
                     "ru": {"accepted": "принят", "rejected": "отклонён", "unchecked": "не проверялся"}},
    "spec.prob": {"en": "probability", "ru": "вероятность"},
    "spec.alpha": {"en": "Acceptance by draft position", "ru": "Принятие по позициям"},
    "spec.alpha_title": {"en": "Acceptance rate α by draft position (overall α = {a:.2f})",
                         "ru": "Доля принятых α по позиции черновика (общая α = {a:.2f})"},
    "spec.no_alpha": {"en": "No drafts have been verified yet.", "ru": "Черновики ещё не проверялись."},
    "spec.position": {"en": "draft position", "ru": "позиция черновика"},
    "spec.rate": {"en": "α = accepted / checked", "ru": "α = принято / проверено"},
    "spec.overall": {"en": "overall α", "ru": "общая α"},
    "spec.acc_hover": {"en": "accepted {a} / checked {r} (drafted {p})",
                       "ru": "принято {a} / проверено {r} (предложено {p})"},
    "spec.pass_hover": {"en": "{t:.2f} tokens / pass", "ru": "{t:.2f} токенов за проход"},
    "spec.pass_counts": {"en": "rounds {n} · accepted {a} / checked {r}",
                         "ru": "раундов {n} · принято {a} / проверено {r}"},
    "spec.speed_hover": {"en": "{n} tokens in {s} s of decoding<br>{v} tok/s",
                         "ru": "{n} токенов за {s} с декодирования<br>{v} ток/с"},
    "spec.pass": {"en": "Tokens per target pass", "ru": "Токенов за проход целевой модели"},
    "spec.pass_title": {"en": "Tokens per target pass: measured {m:.2f}, formula {f:.2f} (α = {a:.2f}, mean k = "
                              "{k:.1f})",
                        "ru": "Токенов за проход: измерено {m:.2f}, по формуле {f:.2f} (α = {a:.2f}, средний k = "
                              "{k:.1f})"},
    "spec.no_pass": {"en": "No speculative rounds yet.", "ru": "Спекулятивных раундов ещё не было."},
    "spec.formula": {"en": "(1 − α^(k+1)) / (1 − α), k = {k}", "ru": "(1 − α^(k+1)) / (1 − α), k = {k}"},
    "spec.measured": {"en": "measured (tokens per round)", "ru": "измерено (токенов за раунд)"},
    "spec.expected": {"en": "formula at the measured α and each round's k",
                      "ru": "формула при измеренной α и k каждого раунда"},
    "spec.alpha_axis": {"en": "acceptance rate α", "ru": "доля принятых α"},
    "spec.tokens_axis": {"en": "tokens per target pass", "ru": "токенов за проход"},
    "spec.speedup": {"en": "Speed-up over plain decoding", "ru": "Ускорение относительно обычного декодирования"},
    "spec.speedup_title": {"en": "{method}, k = {k}: {s:.2f}× plain decoding ({same})",
                           "ru": "{method}, k = {k}: {s:.2f}× от обычного декодирования ({same})"},
    "spec.same": {"en": "same tokens", "ru": "те же токены"},
    "spec.different": {"en": "different tokens (sampling)", "ru": "другие токены (сэмплирование)"},
    "spec.no_speedup": {"en": "Run the comparison to measure the speed-up.",
                        "ru": "Запустите сравнение, чтобы измерить ускорение."},
    "spec.plain": {"en": "plain decoding", "ru": "обычное декодирование"},
    "spec.speculative": {"en": "speculative ({method})", "ru": "спекулятивное ({method})"},
    "spec.tok_s": {"en": "decode tok/s", "ru": "ток/с при декодировании"},
    "spec.table": {"en": "Speculative vs plain decoding", "ru": "Спекулятивное и обычное декодирование"},
    "spec.cols": {"en": ["prompt", "drafter", "k", "plain tok/s", "spec tok/s", "speed-up", "α", "tokens / pass",
                         "formula", "same ids"],
                  "ru": ["запрос", "черновик", "k", "обычн. ток/с", "спек. ток/с", "ускорение", "α",
                         "токенов / проход", "формула", "те же id"]},
    # app/charts/timeline.py
    # ---- weight formats side by side (app/formats_tool.py, app/charts/quantization.py) ----
    "formats.title": {"en": "Weight formats: speed against drift", "ru": "Форматы весов: скорость против дрейфа"},
    "formats.text": {"en": "A weight format is how the model's numbers are stored: fp32 takes 4 bytes per weight, "
                           "bf16 2, int8 about 1, and q4 (the model file's own 4-bit codes, with a scale and a zero "
                           "for every 32 weights) about 0.6. A decode step reads every weight once to make one "
                           "token, so it is limited by memory: fewer bytes per step, a shorter step. The price is "
                           "rounding: each format's next-token distribution drifts a little from fp32's. Here your "
                           "prompt runs under each format: speed on this machine's floor (the fastest a step can be "
                           "at its measured bandwidth), and the drift per generated token: the KL divergence from "
                           "fp32 (0 = the same distribution), whether its top choice is fp32's token, and where its "
                           "greedy text first differs. Each format is loaded on first use (10–60 s each, up to "
                           "~0.8 GB of memory).",
                     "ru": "Формат весов — это то, как хранятся числа модели: fp32 занимает 4 байта на вес, bf16 — 2, "
                           "int8 — около 1, а q4 (собственные 4-битные коды файла модели с масштабом и нулём на "
                           "каждые 32 веса) — около 0,6. Шаг декодирования читает каждый вес один раз ради одного "
                           "токена, поэтому упирается в память: меньше байт на шаг — короче шаг. Цена — округление: "
                           "распределение следующего токена в каждом формате немного уходит от fp32. Здесь ваш "
                           "запрос прогоняется в каждом формате: скорость на «полу» этой машины (быстрее шаг быть "
                           "не может при измеренной пропускной способности) и дрейф на каждом токене: "
                           "KL-дивергенция от fp32 (0 — то же распределение), совпадает ли лучший токен с выбором "
                           "fp32 и где жадный текст впервые расходится. Каждый формат загружается при первом "
                           "запуске (10–60 с, до ~0,8 ГБ памяти)."},
    "formats.pick": {"en": "Formats to compare (fp32 is always the reference)",
                     "ru": "Форматы для сравнения (fp32 — всегда эталон)"},
    "formats.tokens": {"en": "Tokens to generate", "ru": "Сколько токенов сгенерировать"},
    "formats.run": {"en": "Compare weight formats", "ru": "Сравнить форматы весов"},
    "formats.busy": {"en": "Another comparison of weight formats is running on this server: try again when it ends.",
                     "ru": "На сервере уже идёт сравнение форматов весов: попробуйте, когда оно закончится."},
    "formats.no_prompt": {"en": "Type a prompt first.", "ru": "Сначала введите запрос."},
    "formats.replay": {"en": "A replayed trace has no model to run formats on.",
                       "ru": "У воспроизводимой трассы нет модели, чтобы прогнать форматы."},
    "formats.loading": {"en": "Loading the {fmt} weights ({s} s; each format loads once, 10–60 s)…",
                        "ru": "Загружаем веса {fmt} ({s} с; каждый формат загружается один раз, 10–60 с)…"},
    "formats.free": {"en": "{fmt}: generating freely, token {k} of {n} ({s} s)…",
                     "ru": "{fmt}: свободная генерация, токен {k} из {n} ({s} с)…"},
    "formats.forced": {"en": "{fmt}: fed fp32's tokens, token {k} of {n} ({s} s)…",
                       "ru": "{fmt}: подаём токены fp32, токен {k} из {n} ({s} с)…"},
    "formats.done": {"en": "Compared {fmts} on {n} tokens in {s} s.", "ru": "Сравнили {fmts} на {n} токенах за {s} с."},
    "formats.texts": {"en": "Greedy text of each format (after the first token that differs from fp32's: "
                            "highlighted)",
                      "ru": "Жадный текст каждого формата (после первого токена, отличного от fp32, — с подсветкой)"},
    "quant.floor": {"en": "Speed of each format", "ru": "Скорость каждого формата"},
    "quant.floor_title": {"en": "Decode step: measured time against bytes read<br><span style='font-size:11px;"
                                "color:#555'>the line is this machine's floor: the fastest a step reading that many "
                                "bytes can be</span>",
                          "ru": "Шаг декодирования: измеренное время против прочитанных байт<br><span "
                                "style='font-size:11px;color:#555'>линия — «пол» этой машины: быстрее шаг, читающий "
                                "столько байт, быть не может</span>"},
    "quant.x_mb": {"en": "MB read per decode step (weights + KV cache)",
                   "ru": "МБ, читаемые за шаг декодирования (веса + KV-кэш)"},
    "quant.y_ms": {"en": "ms per decode step (median)", "ru": "мс на шаг декодирования (медиана)"},
    "quant.floor_name": {"en": "floor = max(bytes ÷ {bw} GB/s, FLOPs ÷ peak)",
                         "ru": "пол = max(байты ÷ {bw} ГБ/с, флопы ÷ пик)"},
    "quant.floor_hover": {"en": "floor: %{y:.1f} ms at %{x:.0f} MB per step",
                          "ru": "пол: %{y:.1f} мс при %{x:.0f} МБ за шаг"},
    "quant.point_hover": {"en": "<b>%{customdata[0]}</b><br>%{customdata[1]:.0f} MB per step "
                                "(%{customdata[5]:.3f} B per weight)<br>measured %{customdata[2]:.1f} ms · floor "
                                "%{customdata[3]:.1f} ms<br>%{customdata[4]:.0f}% of the floor's speed<br>"
                                "%{customdata[6]:.2f}× the speed of fp32",
                          "ru": "<b>%{customdata[0]}</b><br>%{customdata[1]:.0f} МБ за шаг "
                                "(%{customdata[5]:.3f} Б на вес)<br>измерено %{customdata[2]:.1f} мс · пол "
                                "%{customdata[3]:.1f} мс<br>%{customdata[4]:.0f}% скорости пола<br>"
                                "%{customdata[6]:.2f}× скорости fp32"},
    "quant.kl": {"en": "Drift per token", "ru": "Дрейф на каждом токене"},
    "quant.kl_title": {"en": "Drift from fp32 per generated token: KL(fp32 ‖ format)<br><span style='font-size:11px;"
                             "color:#555'>every format is fed fp32's own tokens, so both see the same text</span>",
                       "ru": "Дрейф от fp32 на каждом токене: KL(fp32 ‖ формат)<br><span style='font-size:11px;"
                             "color:#555'>каждому формату подаются токены fp32, так что оба видят один текст</span>"},
    "quant.x_pos": {"en": "generated token position", "ru": "позиция сгенерированного токена"},
    "quant.y_kl": {"en": "KL divergence (nats)", "ru": "KL-дивергенция (наты)"},
    "quant.kl_hover": {"en": "token %{x}: «%{customdata[0]}»<br>KL %{customdata[2]:.5f} nats<br>its top choice: "
                             "%{customdata[5]} (id %{customdata[1]})<br>logit of fp32's token %{customdata[3]:.3f}, "
                             "log-prob %{customdata[4]:.4f}",
                       "ru": "токен %{x}: «%{customdata[0]}»<br>KL %{customdata[2]:.5f} нат<br>его лучший токен: "
                             "%{customdata[5]} (id %{customdata[1]})<br>логит токена fp32 %{customdata[3]:.3f}, "
                             "log-вероятность %{customdata[4]:.4f}"},
    "quant.agrees": {"en": "the same as fp32's", "ru": "тот же, что у fp32"},
    "quant.differs": {"en": "NOT fp32's token", "ru": "НЕ токен fp32"},
    "quant.differs_key": {"en": "its top choice differs", "ru": "его лучший токен другой"},
    "quant.logit": {"en": "Logit of the chosen token", "ru": "Логит выбранного токена"},
    "quant.logit_title": {"en": "The logit each format gives fp32's chosen token",
                          "ru": "Логит, который каждый формат даёт токену, выбранному fp32"},
    "quant.y_logit": {"en": "raw logit", "ru": "сырой логит"},
    "quant.logit_hover": {"en": "token %{x}: «%{customdata[0]}»<br>logit %{customdata[1]:.3f}<br>log-prob "
                                "%{customdata[2]:.4f}",
                          "ru": "токен %{x}: «%{customdata[0]}»<br>логит %{customdata[1]:.3f}<br>log-вероятность "
                                "%{customdata[2]:.4f}"},
    "quant.table": {"en": "Formats compared", "ru": "Сравнение форматов"},
    "quant.table_title": {"en": "Formats compared on your prompt ({p} prompt tokens, {n} generated)",
                          "ru": "Форматы на вашем запросе ({p} ток. запроса, {n} сгенерировано)"},
    "quant.cols": {"en": ["format", "B/weight", "MB/step", "ms/step", "× fp32", "top-1 same", "text differs at",
                          "mean KL"],
                   "ru": ["формат", "Б/вес", "МБ/шаг", "мс/шаг", "× fp32", "top-1 совп.", "текст расходится на",
                          "средняя KL"]},
    "quant.never": {"en": "never", "ru": "нигде"},
    "quant.end": {"en": "the end", "ru": "конце"},
    "quant.at": {"en": "token {i} («{tok}»)", "ru": "токене {i} («{tok}»)"},
    "quant.none": {"en": "Click “Compare weight formats” to run your prompt under each format.",
                   "ru": "Нажмите «Сравнить форматы весов», чтобы прогнать запрос в каждом формате."},
    "quant.no_machine": {"en": "This machine's bandwidth is still being measured.",
                         "ru": "Пропускная способность этой машины ещё измеряется."},
    "quant.no_decode": {"en": "No decode step was measured: generate at least 2 tokens.",
                        "ru": "Ни один шаг декодирования не измерен: сгенерируйте хотя бы 2 токена."},
    "quant.only_fp32": {"en": "Choose a format besides fp32 to see its drift.",
                        "ru": "Выберите формат кроме fp32, чтобы увидеть его дрейф."},
    "timeline.timeline": {"en": "Step timeline", "ru": "Шкала шагов"},
    "timeline.timeline_title": {"en": "Each engine step: its batch, its time",
                                "ru": "Каждый шаг движка: его батч и время"},
    "timeline.no_steps": {"en": "Step the engine to see the timeline.", "ru": "Сделайте шаг, чтобы увидеть шкалу."},
    "timeline.step": {"en": "step", "ru": "шаг"},
    "timeline.ms": {"en": "step time (ms)", "ru": "время шага (мс)"},
    "timeline.kinds": {"en": {"prefill": "prefill",
                              "decode": "decode",
                              "mixed": "mixed (prefill + decode)",
                              "idle": "idle"},
                       "ru": {"prefill": "префилл",
                              "decode": "декодирование",
                              "mixed": "смешанный (префилл + декод)",
                              "idle": "простой"}},
    "timeline.tok": {"en": "tok", "ru": "ток."},
    "timeline.seq": {"en": "seq", "ru": "посл."},
    "timeline.forward": {"en": "forward", "ru": "прямой проход"},
    "timeline.grammar_ms": {"en": "grammar masks {ms:.2f} ms (forward {fwd:.1f} ms)",
                            "ru": "маски грамматики {ms:.2f} мс (прямой проход {fwd:.1f} мс)"},
    "timeline.grammar_ms_hover": {"en": "grammar masks %{y:.2f} ms", "ru": "маски грамматики %{y:.2f} мс"},
    "timeline.grammar_key": {"en": "grammar masks", "ru": "маски грамматики"},
    "timeline.sample": {"en": "sample", "ru": "сэмплирование"},
    "timeline.schedule": {"en": "schedule", "ru": "планирование"},
    "timeline.preempted": {"en": "preempted", "ru": "вытеснены"},
    "timeline.admitted": {"en": "admitted", "ru": "приняты"},
    "timeline.finished": {"en": "finished", "ru": "завершены"},
    "timeline.latency": {"en": "Latency per sequence", "ru": "Задержки по последовательностям"},
    "timeline.latency_title": {"en": "Latency per sequence (engine time: sum of step durations, idle time excluded)",
                               "ru": "Задержки (время движка: сумма длительностей шагов, простой не учитывается)"},
    "timeline.cols": {"en": ["seq", "TTFT (ms)", "mean TPOT / ITL (ms)", "tokens generated", "tok/s (1 / mean ITL)",
                             "status"],
                      "ru": ["посл.", "TTFT (мс)", "средний TPOT / ITL (мс)", "сгенерировано токенов",
                             "ток/с (1 / ITL)", "статус"]},
    "timeline.running": {"en": "running", "ru": "идёт"},
    "timeline.roofline": {"en": "Roofline", "ru": "Roofline"},
    "timeline.roofline_title": {"en": "Roofline of this machine<br><span style='font-size:11px;color:#555'>each "
                                      "step's arithmetic intensity vs achieved FLOP/s</span>",
                                "ru": "Roofline этой машины<br><span "
                                      "style='font-size:11px;color:#555'>интенсивность шагов и их флоп/с</span>"},
    "timeline.no_roof": {"en": "No forward pass measured yet: step the engine.",
                         "ru": "Прямых проходов ещё не было: сделайте шаг."},
    "timeline.bad_machine": {"en": "The machine's bandwidth and peak FLOP/s are not known yet.",
                             "ru": "Пропускная способность памяти и пиковая производительность машины ещё не измерены."},
    "timeline.x": {"en": "arithmetic intensity (FLOP / byte moved)",
                   "ru": "арифметическая интенсивность (флоп / байт)"},
    "timeline.y": {"en": "achieved FLOP/s (forward pass)", "ru": "достигнутые флоп/с (прямой проход)"},
    "timeline.roof": {"en": "roof = min(peak, bandwidth × intensity)",
                      "ru": "крыша = min(пик, пропускная способность × интенсивность)"},
    "timeline.ridge": {"en": "ridge {r:.1f} FLOP/B", "ru": "перегиб {r:.1f} флоп/Б"},
    "timeline.mem_bound": {"en": "memory-bound: {bw}", "ru": "упор в память: {bw}"},
    "timeline.compute_bound": {"en": "compute peak: {pf}", "ru": "пик вычислений: {pf}"},
    "timeline.of_roof": {"en": "of the roof", "ru": "от крыши"},
    "timeline.roof_name": {"en": "roof", "ru": "крыша"},
    "timeline.step_ms": {"en": "step %{y:.1f} ms", "ru": "шаг %{y:.1f} мс"},
    "timeline.forward_ms": {"en": "forward %{customdata[2]:.1f} ms", "ru": "прямой проход %{customdata[2]:.1f} мс"},
    # the timeline's batch composition (issue 13, item 7)
    "timeline.in_step": {"en": "sequences in the step", "ru": "последоват. в шаге"},
    "timeline.ms_short": {"en": "ms", "ru": "мс"},
    "timeline.kind_step": {"en": "{kind} step", "ru": "шаг: {kind}"},
    "timeline.waiting": {"en": "waiting", "ru": "ждут"},
    "timeline.other_tab": {"en": "another tab's sequence", "ru": "последовательность другой вкладки"},
    "timeline.other_tabs": {"en": "other tabs", "ru": "другие вкладки"},
    "timeline.phase_prefill": {"en": "prefill chunk", "ru": "кусок префилла"},
    "timeline.phase_decode": {"en": "decode", "ru": "декодирование"},
    "timeline.phase_verify": {"en": "speculative verify", "ru": "спекулятивная проверка"},
    "timeline.chunk_more": {"en": "the prompt is not finished: more chunks follow",
                            "ru": "запрос ещё не дочитан: будут ещё куски"},
    "timeline.waits": {"en": "waiting: {n} ahead in the queue", "ru": "ждёт: впереди в очереди {n}"},
    "timeline.preempt_why": {"en": "preempted: the KV pool was full, its blocks were freed; it will be recomputed",
                             "ru": "вытеснена: пул KV заполнен, её блоки освобождены; её пересчитают заново"},
    "timeline.preempted_short": {"en": "preempted", "ru": "вытеснена"},
    # app/charts/tokens.py
    "bytes_chart.title": {"en": "Bytes per token · mean {mean:.2f}", "ru": "Байт на токен · в среднем {mean:.2f}"},
    "bytes_chart.empty_title": {"en": "Bytes per token", "ru": "Байт на токен"},
    "bytes_chart.empty": {"en": "Enter a prompt to see how many bytes each token covers",
                          "ru": "Введите промпт, чтобы увидеть, сколько байт покрывает каждый токен"},
    "bytes_chart.prompt": {"en": "prompt", "ru": "промпт"},
    "bytes_chart.special": {"en": "special", "ru": "служебный"},
    "bytes_chart.generated": {"en": "generated", "ru": "сгенерировано"},
    "bytes_chart.x": {"en": "Token position", "ru": "Позиция токена"},
    "bytes_chart.y": {"en": "UTF-8 bytes", "ru": "Байт UTF-8"},
    "bytes_chart.bytes": {"en": "bytes", "ru": "байт"},
    "bytes_chart.mean": {"en": "mean", "ru": "среднее"},
    # app/panels/kv.py
    "kv_panel.empty": {"en": "Step the engine to fill in the KV-cache formula.",
                       "ru": "Сделайте шаг, чтобы заполнить формулу KV-кэша."},
    "kv_panel.layers": {"en": "layers", "ru": "слоёв"},
    "kv_panel.kv_heads": {"en": "KV heads", "ru": "KV-голов"},
    "kv_panel.head_dim": {"en": "head dim", "ru": "размер головы"},
    "kv_panel.per_token": {"en": "per token", "ru": "на токен"},
    "kv_panel.block": {"en": "block of {bs} tokens", "ru": "блок из {bs} токенов"},
    "kv_panel.pool": {"en": "pool = {n} blocks", "ru": "пул = {n} блоков"},
    "kv_panel.hit_rate": {"en": "prefix-cache hit rate", "ru": "доля попаданий в префиксный кэш"},
    "kv_panel.hit_detail": {"en": "{hit} of {q} prompt tokens found cached",
                            "ru": "{hit} из {q} токенов запроса уже были в кэше"},
    "kv_panel.saved": {"en": "prefill tokens saved", "ru": "сэкономлено токенов префилла"},
    "kv_panel.evictions": {"en": "evictions (cached blocks reused for new data)",
                           "ru": "вытеснения (блоки кэша отданы под новые данные)"},
    "kv_panel.preemptions": {"en": "preemptions (sequences sent back to wait, KV freed)",
                             "ru": "вытеснения последовательностей (отправлены ждать, KV освобождён)"},
    "kv_panel.cow": {"en": "copy-on-write block copies", "ru": "копирования при записи (COW)"},
    "kv_panel.shared": {"en": "blocks shared right now", "ru": "общих блоков сейчас"},
    "kv_panel.note": {"en": "K and V (×2) for every layer and KV head",
                      "ru": "K и V (×2) для каждого слоя и KV-головы"},
    # app/panels/pipeline.py
    "pipeline.names": {"en": {"template": "Chat template",
                              "tokens": "Tokens",
                              "embeddings": "Embeddings",
                              "layers": "Transformer layers",
                              "logits": "Logits",
                              "sampling": "Sampling",
                              "detokenizer": "Detokenizer",
                              "stream": "Stream"},
                       "ru": {"template": "Шаблон чата",
                              "tokens": "Токены",
                              "embeddings": "Эмбеддинги",
                              "layers": "Слои трансформера",
                              "logits": "Логиты",
                              "sampling": "Сэмплирование",
                              "detokenizer": "Детокенизатор",
                              "stream": "Поток"}},
    "pipeline.none": {"en": "no step yet: enter a prompt and press Step",
                      "ru": "шагов ещё не было: введите запрос и нажмите «Шаг»"},
    "pipeline.step": {"en": "step", "ru": "шаг"},
    "pipeline.grammar_dominates": {"en": "building the grammar masks took {ms:.1f} ms, more than the model's forward "
                                         "({fwd:.1f} ms)",
                                   "ru": "построение масок грамматики заняло {ms:.1f} мс — больше, чем прямой "
                                         "проход модели ({fwd:.1f} мс)"},
    "pipeline.idle": {"en": "idle (nothing scheduled)", "ru": "простой (нечего планировать)"},
    "pipeline.prefill": {"en": "prefill {n} tok", "ru": "префилл {n} ток."},
    "pipeline.decode": {"en": "decode {n} seqs", "ru": "декод {n} посл."},
    "pipeline.decode1": {"en": "decode 1 seq", "ru": "декод 1 посл."},
    # {ids}: sequence ids as "#0, #3" (issue 13, item 13: "finished 0" read as zero sequences)
    "pipeline.preempted": {"en": "seqs {ids} preempted", "ru": "вытеснены посл. {ids}"},
    "pipeline.preempted1": {"en": "seq {ids} preempted", "ru": "вытеснена посл. {ids}"},
    "pipeline.finished": {"en": "seqs {ids} finished", "ru": "завершены посл. {ids}"},
    "pipeline.finished1": {"en": "seq {ids} finished", "ru": "завершена посл. {ids}"},
    # app/panels/stream.py
    "stream.empty": {"en": "Nothing streamed yet for sequence {seq}.",
                     "ru": "Последовательность {seq} ещё ничего не выдала."},
    "stream.held": {"en": "held back by the detokenizer: a possible stop-string prefix or an incomplete UTF-8 "
                          "character",
                    "ru": "придержано детокенизатором: возможное начало стоп-строки или неполный символ UTF-8"},
    "stream.finish": {"en": {"eos": "eos", "stop": "stop", "length": "length", "abort": "abort",
                             "grammar": "grammar complete"},
                      "ru": {"eos": "eos", "stop": "стоп", "length": "длина", "abort": "прервано",
                             "grammar": "грамматика завершена"}},
    "stream.finish_title": {"en": "finished: {r}", "ru": "завершено: {r}"},
    # app/panels/tokens.py
    "tokens.template_empty": {"en": "Enter a prompt to see the text the model reads",
                              "ru": "Введите промпт, чтобы увидеть текст, который читает модель"},
    "tokens.special": {"en": "special token", "ru": "служебный токен"},
    "tokens.special_tokens": {"en": "special token · token {a}", "ru": "служебный токен · токен {a}"},
    "tokens.implicit": {"en": "special token the tokenizer adds without text",
                        "ru": "служебный токен, который токенизатор добавляет без текста"},
    "tokens.chips_empty": {"en": "No tokens yet", "ru": "Токенов пока нет"},
    "tokens.chips_more": {"en": "… {k} more tokens (positions {first}–{last})",
                          "ru": "… ещё токенов: {k} (позиции {first}–{last})"},
    "tokens.chips_show": {"en": "show", "ru": "показать"},
    "tokens.chips_hide": {"en": "hide", "ru": "скрыть"},
    "tokens.template_scroll": {"en": "The prompt as the model reads it ({n} characters): scroll inside this box",
                               "ru": "Запрос так, как его читает модель ({n} символов): прокрутите внутри этого окна"},
    "tokens.counts": {"en": "{chars} characters · {nbytes} UTF-8 bytes · {tokens} tokens ({prompt} prompt + {gen} "
                            "generated) · {bpt:.2f} bytes per token",
                      "ru": "{chars} символов · {nbytes} байт UTF-8 · {tokens} токенов ({prompt} промпт + {gen} "
                            "сгенерировано) · {bpt:.2f} байт на токен"},
    "tokens.pos": {"en": "pos", "ru": "поз."},
    "tokens.bytes": {"en": "bytes", "ru": "байты"},
    "tokens.piece": {"en": "piece", "ru": "запись в словаре"},
    "tokens.flag_special": {"en": "special", "ru": "служебный"},
    "tokens.flag_fallback": {"en": "byte fallback", "ru": "байтовый запасной токен"},
    "tokens.flag_partial": {"en": "partial UTF-8 (an incomplete character)", "ru": "неполный UTF-8 (часть символа)"},
    "tokens.flag_generated": {"en": "generated", "ru": "сгенерирован"},
    "tokens.flag_forced": {"en": "generated: forced by the user, not sampled",
                           "ru": "сгенерирован: навязан пользователем, а не выбран розыгрышем"},
    "tokens.forced_count": {"en": "forced: {n} (purple chips)", "ru": "навязано: {n} (фиолетовые фишки)"},
    "tokens.bpe_empty": {"en": "Type a word to see how BPE merges its bytes into tokens",
                         "ru": "Введите слово, чтобы увидеть, как BPE склеивает его байты в токены"},
    "tokens.step": {"en": "Step", "ru": "Шаг"},
    "tokens.merge": {"en": "Merge", "ru": "Слияние"},
    "tokens.symbols": {"en": "Symbols", "ru": "Символы"},
    "tokens.initial": {"en": "initial symbols", "ru": "исходные символы"},
    "tokens.whole": {"en": "whole pre-token taken from the vocabulary",
                     "ru": "весь претокен взят из словаря целиком"},
    "tokens.rank": {"en": "rank", "ru": "ранг"},
    "tokens.id": {"en": "id", "ru": "id"},
    "tokens.not_in_vocab": {"en": "not in vocabulary", "ru": "нет в словаре"},
    # ---- attach mode (python -m app --attach URL): the lab drawn from an OpenAI-compatible server's answers
    "attach.title": {"en": "InferLab — attached to a serving engine", "ru": "InferLab — подключена к серверу модели"},
    "attach.target": {"en": "Attached to {url} · model {model}. Every panel below is drawn from this server's "
                            "answers and from times measured here; the lab sends the server only the requests you "
                            "send.",
                      "ru": "Подключено к {url} · модель {model}. Все панели ниже построены по ответам этого сервера "
                            "и по времени, измеренному здесь; лаборатория отправляет серверу только ваши запросы."},
    "attach.prompt": {"en": "Prompt", "ru": "Запрос"},
    "attach.system": {"en": "System prompt (optional)", "ru": "Системный запрос (необязательно)"},
    "attach.temperature": {"en": "temperature", "ru": "температура"},
    "attach.max_tokens": {"en": "max tokens", "ru": "макс. токенов"},
    "attach.top_n": {"en": "top-N log-probabilities", "ru": "вероятностей в топе (N)"},
    "attach.seed": {"en": "seed", "ru": "зерно"},
    "attach.send": {"en": "Send", "ru": "Отправить"},
    "attach.sending": {"en": "sending…", "ru": "отправляем…"},
    "attach.step": {"en": "token", "ru": "токен"},
    "attach.panel_tokens": {"en": "1 · The prompt as the model reads it", "ru": "1 · Запрос глазами модели"},
    "attach.panel_stream": {"en": "2 · The streamed deltas", "ru": "2 · Потоковые фрагменты текста"},
    "attach.panel_stream_text": {"en": "Each chunk of text as the server's streaming detokenizer released it, with "
                                       "its arrival time in ms after the request was sent (measured here).",
                                 "ru": "Каждый фрагмент текста в том виде, в каком его выпустил потоковый "
                                       "детокенизатор сервера, и время его прихода в мс после отправки запроса "
                                       "(измерено здесь)."},
    "attach.panel_top": {"en": "3 · The server's top-N at each token", "ru": "3 · Топ-N сервера для каждого токена"},
    "attach.panel_top_text": {"en": "The log-probabilities the server returned (logprobs, top_logprobs): only its N "
                                    "most likely tokens, not the full distribution; the chart says how much "
                                    "probability the N leave out. Move the slider to pick the token.",
                              "ru": "Логарифмы вероятностей, которые вернул сервер («logprobs», «top_logprobs»): "
                                    "только N самых вероятных токенов, а не всё распределение; на графике видно, "
                                    "сколько вероятности осталось за пределами топа. Ползунок выбирает токен."},
    "attach.panel_timing": {"en": "4 · Time to first token and between tokens",
                            "ru": "4 · Время до первого токена и между токенами"},
    "attach.panel_metrics": {"en": "5 · The server's metrics over time", "ru": "5 · Метрики сервера во времени"},
    "attach.panel_metrics_text": {"en": "Read from the server's own /metrics every second while this page is open: "
                                        "KV-cache usage, requests running and waiting, prefix-cache hit rate, "
                                        "preemptions (vLLM, SGLang, llama.cpp and InferLab names are understood).",
                                  "ru": "Каждую секунду, пока открыта страница, читаем собственные метрики сервера "
                                        "(/metrics): заполнение KV-кэша, выполняемые и ждущие запросы, долю "
                                        "попаданий в кэш префиксов, вытеснения (понимаем имена метрик vLLM, "
                                        "«SGLang», «llama.cpp» и InferLab)."},
    "attach.panel_absent": {"en": "6 · What an attached server does not show", "ru": "6 · Чего подключённый сервер "
                                                                                         "не показывает"},
    "attach.absent_text": {"en": "These panels of the lab need the engine's insides, which an OpenAI-compatible "
                                 "server does not expose; run the lab on its own engine to see them:",
                           "ru": "Этим панелям лаборатории нужно внутреннее устройство движка, а совместимый с "
                                 "«OpenAI» сервер его не открывает; запустите лабораторию на собственном движке, "
                                 "чтобы их увидеть:"},
    "attach.absent_items": {"en": ["attention per layer and head, the logit lens, embeddings and residual norms",
                                   "the full next-token distribution and each stage of the sampling chain",
                                   "KV block tables, the block pool and prefix sharing block by block",
                                   "the scheduler's batches step by step, preemptions as they happen",
                                   "speculative drafts and their verification"],
                            "ru": ["внимание по слоям и головам, логит-линза, эмбеддинги и нормы остаточного потока",
                                   "полное распределение следующего токена и каждый этап цепочки сэмплирования",
                                   "таблицы блоков KV, пул блоков и общие префиксы блок за блоком",
                                   "батчи планировщика шаг за шагом и вытеснения в момент, когда они происходят",
                                   "черновики спекулятивного декодирования и их проверка"]},
    "attach.top_title": {"en": "The server's top-{n} at token {i} «{token}» (the other tokens: {rest})",
                         "ru": "Топ-{n} сервера для токена {i} «{token}» (остальные токены: {rest})"},
    "attach.top_title_empty": {"en": "The server's top-N", "ru": "Топ-N сервера"},
    "attach.top_x": {"en": "probability (e^logprob)", "ru": "вероятность (e^log p)"},
    "attach.no_logprobs": {"en": "no log-probabilities yet (or the server sends none)",
                           "ru": "вероятностей пока нет (или сервер их не присылает)"},
    "attach.timing_title": {"en": "Measured here: first token after {ttft} ms, then a median {itl} ms between tokens",
                            "ru": "Измерено здесь: первый токен через {ttft} мс, затем в среднем (медиана) {itl} мс "
                                  "между токенами"},
    "attach.timing_title_empty": {"en": "Time to first token and between tokens",
                                  "ru": "Время до первого токена и между токенами"},
    "attach.timing_x": {"en": "token (the first bar: time to first token)",
                        "ru": "токен (первый столбец: время до первого токена)"},
    "attach.no_tokens": {"en": "no tokens yet: send a prompt", "ru": "токенов пока нет: отправьте запрос"},
    "attach.metrics_title": {"en": "The server's /metrics over time", "ru": "Метрики сервера (/metrics) во времени"},
    "attach.metrics_x": {"en": "seconds (0 = now)", "ru": "секунды (0 = сейчас)"},
    "attach.metrics_wait": {"en": "reading the server's metrics…", "ru": "читаем метрики сервера…"},
    "attach.metrics_none": {"en": "the server exposes no metrics this page understands",
                            "ru": "сервер не отдаёт метрик, понятных этой странице"},
    "attach.q_kv_usage": {"en": "KV cache used, %", "ru": "KV-кэш занят, %"},
    "attach.q_hit_rate": {"en": "prefix-cache hits, %", "ru": "попадания в кэш префиксов, %"},
    "attach.q_running": {"en": "running (right axis)", "ru": "выполняются (правая ось)"},
    "attach.q_waiting": {"en": "waiting (right axis)", "ru": "ждут (правая ось)"},
    "attach.q_preemptions": {"en": "preemptions (right axis)", "ru": "вытеснения (правая ось)"},
    "attach.stream_empty": {"en": "Send a prompt: its answer streams here.", "ru": "Отправьте запрос: ответ появится "
                                                                                   "здесь по частям."},
    "attach.finished": {"en": "finished ({reason}): {n} tokens; the server counted {prompt} prompt and {completion} "
                              "completion tokens",
                        "ru": "завершено ({reason}): токенов {n}; сервер насчитал {prompt} токенов запроса и "
                              "{completion} токенов ответа"},
    "attach.no_tokenizer": {"en": "The model's tokenizer could not be loaded here ({why}), and the server answers "
                                  "no tokenize endpoint (/tokenize as vLLM and this lab, /extras/tokenize as "
                                  "llama-cpp-python); the server's answers are still drawn below.",
                            "ru": "Токенизатор модели здесь загрузить не удалось ({why}), а токенизировать сервер "
                                  "не умеет (нет ни /tokenize, как у vLLM и этой лаборатории, ни /extras/tokenize, "
                                  "как у «llama-cpp-python»); ответы сервера всё равно показаны ниже."},
    "attach.token_count": {"en": "{n} tokens through the model's own tokenizer and chat template (the server "
                                 "counted {server})",
                           "ru": "токенов: {n} — по собственному токенизатору и шаблону чата модели (сервер "
                                 "насчитал {server})"},
    "attach.token_count_server": {"en": "{n} tokens from the server's own /tokenize, its chat template applied (the "
                                        "template's text is not returned; the model's tokenizer could not be loaded "
                                        "here: {why}). The server counted {server}",
                                  "ru": "токенов: {n} — от собственного /tokenize сервера, с его шаблоном чата (текст "
                                        "шаблона сервер не возвращает; токенизатор модели здесь загрузить не "
                                        "удалось: {why}). Сервер насчитал {server}"},
    "attach.token_count_raw": {"en": "{n} tokens of the prompt's own text from the server's /extras/tokenize: the "
                                     "server wraps it in a chat template it does not show, so it counted {server} "
                                     "(the model's tokenizer could not be loaded here: {why})",
                               "ru": "токенов: {n} — сам текст запроса по /extras/tokenize сервера: сервер "
                                     "оборачивает его в шаблон чата, которого не показывает, поэтому насчитал "
                                     "{server} (токенизатор модели здесь загрузить не удалось: {why})"},
    # the server's answer carried no usage (llama-cpp-python's streams): said instead of a count
    "attach.finished_no_usage": {"en": "finished ({reason}): {n} tokens; the server sent no token counts (its answer "
                                       "had no usage)",
                                 "ru": "завершено ({reason}): токенов {n}; сервер не прислал число токенов (в его "
                                       "ответе нет поля «usage»)"},
    "attach.token_count_no_usage": {"en": "{n} tokens through the model's own tokenizer and chat template (the "
                                          "server sent no count of its own: its answer had no usage)",
                                    "ru": "токенов: {n} — по собственному токенизатору и шаблону чата модели (сервер "
                                          "своего числа не прислал: в его ответе нет поля «usage»)"},
    "attach.token_count_server_no_usage": {"en": "{n} tokens from the server's own /tokenize, its chat template "
                                                 "applied (the template's text is not returned; the model's "
                                                 "tokenizer could not be loaded here: {why}). The server's answer "
                                                 "had no usage, so no count of its own",
                                           "ru": "токенов: {n} — от собственного /tokenize сервера, с его шаблоном "
                                                 "чата (текст шаблона сервер не возвращает; токенизатор модели здесь "
                                                 "загрузить не удалось: {why}). В ответе сервера нет поля «usage», своего "
                                                 "числа он не прислал"},
    "attach.token_count_raw_no_usage": {"en": "{n} tokens of the prompt's own text from the server's "
                                              "/extras/tokenize: the server wraps it in a chat template it does not "
                                              "show, and its answer had no usage, so the template's tokens are not "
                                              "counted here (the model's tokenizer could not be loaded here: {why})",
                                        "ru": "токенов: {n} — сам текст запроса по /extras/tokenize сервера: сервер "
                                              "оборачивает его в шаблон чата, которого не показывает, а в его ответе "
                                              "нет поля «usage», поэтому токены шаблона здесь не сосчитаны (токенизатор "
                                              "модели здесь загрузить не удалось: {why})"},
    "attach.metrics_absent": {"en": "the server has no /metrics (it answered HTTP {status}); asked again in {s} s, "
                                    "less and less often, up to once a minute",
                              "ru": "у сервера нет /metrics (он ответил кодом {status}); спросим снова через {s} с, "
                                    "всё реже, до раза в минуту"},
    # ---- attach mode's room load and its field for another server (app/attach_room.py, app/attach_server.py)
    "attach.panel_room": {"en": "7 · Load from the room", "ru": "7 · Нагрузка от зала"},
    "attach.room_text": {"en": "Followers open this page's /follow on their own devices. With the presenter token "
                               "(printed when this page's server started), every follower's page sends the prompt "
                               "above once, at the same moment, to the attached server — through this page's "
                               "server, which keeps the key — and shows its own answer and time to first token; "
                               "the summary below adds them up beside the server's /metrics.",
                         "ru": "Слушатели открывают /follow этой страницы на своих устройствах. С токеном ведущего "
                               "(печатается при запуске сервера этой страницы) каждая страница слушателя один раз и "
                               "в один и тот же момент отправляет запрос выше подключённому серверу — через сервер "
                               "этой страницы, который хранит ключ, — и показывает свой ответ и время до первого "
                               "токена; ниже — итог по залу рядом с /metrics сервера."},
    "attach.token": {"en": "presenter token", "ru": "токен ведущего"},
    "attach.room_send": {"en": "Every follower sends the prompt now", "ru": "Каждый слушатель отправляет запрос"},
    "attach.follow_ready": {"en": "connected · this page sends one request when the presenter asks the room",
                            "ru": "подключено · эта страница отправит запрос, когда ведущий попросит зал"},
    "attach.follow_text": {"en": "The lab is attached to a serving engine. When the presenter asks the room, this page "
                                 "sends it one request and shows the answer and the time to its first token, "
                                 "measured in this browser.",
                           "ru": "Лаборатория подключена к серверу модели. Когда ведущий попросит зал, эта страница "
                                 "отправит ему один запрос и покажет ответ и время до первого токена, измеренное в "
                                 "этом браузере."},
    "attach.panel_switch": {"en": "8 · Attach to another server", "ru": "8 · Подключиться к другому серверу"},
    "attach.switch_local": {"en": "This page's server listens on this machine only, so the field needs no token. "
                                  "(Listening on a network address, it would ask for the presenter token: a public "
                                  "lab must not become a way to reach any address.)",
                            "ru": "Сервер этой страницы слушает только этот компьютер, поэтому токен не нужен. (На "
                                  "сетевом адресе понадобится токен ведущего: открытая лаборатория не должна "
                                  "становиться дорогой к любому адресу.)"},
    "attach.switch_token": {"en": "This page's server listens on a network address: pointing it at another server "
                                  "needs the presenter token (section 7), so that a public lab does not become a "
                                  "way to reach any address.",
                            "ru": "Сервер этой страницы слушает сетевой адрес: чтобы направить его к другому "
                                  "серверу, нужен токен ведущего (раздел 7) — открытая лаборатория не должна "
                                  "становиться дорогой к любому адресу."},
    "attach.url": {"en": "server URL", "ru": "адрес сервера"},
    "attach.api_key": {"en": "its API key (optional)", "ru": "его ключ API (необязательно)"},
    "attach.model": {"en": "model (optional)", "ru": "модель (необязательно)"},
    "attach.switch": {"en": "Attach", "ru": "Подключить"},
    "attach.switched": {"en": "attached to {url} · model {model}: reloading…",
                        "ru": "подключено к {url} · модель {model}: перезагружаем…"},
    # ---- load from the room (app/room_load.py): the presenter's button, its summary, the follower's own request
    "room_owner.follower": {"en": "follower", "ru": "слушатель"},
    "load_btn": {"en": "Every follower sends one request now", "ru": "Каждый слушатель отправляет один запрос"},
    "load_sent": {"en": "Room load {round}: {n} followers' pages were asked to send the prompt above at once.",
                  "ru": "Нагрузка от зала {round}: страницы слушателей ({n}) одновременно отправляют запрос выше."},
    "load_nobody": {"en": "Nobody follows the lecture yet: the room load needs followers at /follow.",
                    "ru": "Лекцию пока никто не смотрит: для нагрузки от зала нужны слушатели на /follow."},
    "load_cooldown": {"en": "The last room load began moments ago: wait {wait} s before the next.",
                      "ru": "Предыдущая нагрузка от зала началась только что: подождите {wait} с."},
    "load_prompt": {"en": "The room load's prompt must be 1 to {max} characters.",
                    "ru": "Запрос для нагрузки от зала должен быть длиной от 1 до {max} символов."},
    "load_numbers": {"en": "The room load needs max tokens of at least 1 (at most {max} are used) and a "
                           "temperature from 0 to 2.",
                     "ru": "Для нагрузки от зала нужно не меньше 1 токена (используется не больше {max}) и "
                           "температура от 0 до 2."},
    "load_not_presenter": {"en": "Only the presenter can ask the room to send requests: present first (the "
                                 "presenter token).",
                           "ru": "Просить зал отправить запросы может только ведущий: сначала начните показ (токен "
                                 "ведущего)."},
    "load.none": {"en": "No room load yet: the button asks every follower's page to send one request at the same "
                        "moment, and this box shows how the engine took it.",
                  "ru": "Нагрузки от зала ещё не было: кнопка просит каждую страницу слушателя отправить один "
                        "запрос в один и тот же момент, а здесь видно, как движок с этим справился."},
    "load.round": {"en": "Room load {round}: {answered} of {asked} followers answered",
                   "ru": "Нагрузка от зала {round}: ответили {answered} из {asked} слушателей"},
    "load.failed": {"en": "{n} failed", "ru": "не удалось: {n}"},
    "load.waiting": {"en": "waiting for the others… ({s} s)", "ru": "ждём остальных… ({s} с)"},
    "load.ttft": {"en": "time to first token, measured in the followers' browsers: median {p50} ms, 95th "
                        "percentile {p95} ms",
                  "ru": "время до первого токена в браузерах слушателей: медиана {p50} мс, 95-й процентиль "
                        "{p95} мс"},
    "load.throughput": {"en": "{tokens} tokens generated for them in {window} s: {tok_s} tok/s together",
                        "ru": "для них сгенерировано токенов: {tokens} за {window} с — {tok_s} tok/s вместе"},
    "load.batches_room": {"en": "the engine ran {steps} steps with their requests: batches of up to {max} "
                                "sequences (mean {mean}), up to {ours} of the followers' requests in one step",
                          "ru": "движок выполнил с их запросами шагов: {steps}; в батче до {max} "
                                "последовательностей (в среднем {mean}), до {ours} запросов слушателей за шаг"},
    "load.batches_metrics": {"en": "the server's /metrics: up to {max} requests running at once (mean {mean} over "
                                   "{n} readings)",
                             "ru": "по /metrics сервера: до {max} запросов выполнялись одновременно (в среднем "
                                   "{mean} по {n} замерам)"},
    "follow.load_title": {"en": "Your request · room load {round} (the presenter asked {of} pages at once)",
                          "ru": "Ваш запрос · нагрузка от зала {round} (ведущий попросил страниц: {of})"},
    "follow.load_sending": {"en": "sending…", "ru": "отправляем…"},
    "follow.load_ttft": {"en": "first token after {ms} ms (measured in this browser)",
                         "ru": "первый токен через {ms} мс (измерено в этом браузере)"},
    "follow.load_done": {"en": "{tokens} tokens in {s} s", "ru": "токенов: {tokens} за {s} с"},
    "follow.load_failed": {"en": "the request failed: {why}", "ru": "запрос не удался: {why}"},
    "follow.load_skipped": {"en": "The presenter asked the room for requests; this page was not picked this time.",
                            "ru": "Ведущий попросил зал отправить запросы; эту страницу на этот раз не выбрали."},
}

# the stage panels in page order (their title and explanation: "panel.<key>.title", "panel.<key>.text")
PANEL_KEYS = ("template", "embeddings", "layers", "logits", "sampling", "detok", "kv", "timeline", "speculative",
              "room")


def lang_of(value) -> str:
    """The language a client asked for: "ru", or English for anything else (even junk a client sent)."""
    return "ru" if value == "ru" else "en"


def t(key: str, lang: str):
    """The text of `key` in `lang`; a key missing from the table is a bug (KeyError), never a blank on the page."""
    return UI[key][lang_of(lang)]


def texts(section: str, lang: str):
    """A section's texts in one language, keyed without the section's prefix: texts("kv", "ru")["pool"]."""
    return _section(section, lang_of(lang))


@functools.cache
def _section(section: str, lang: str):
    prefix = section + "."
    found = {k[len(prefix):]: v[lang] for k, v in UI.items() if k.startswith(prefix)}
    if not found:
        raise KeyError(f"no texts in section {section!r}")
    return MappingProxyType(found)  # read-only: every chart shares it


@dataclass(frozen=True, eq=False)
class Phrase:
    """A message in no language yet: a table key and the fields its text is formatted with (a field may be a
    Phrase itself). Made where the tab's language is not known; `text(lang)` renders it where it is."""

    key: str
    fields: dict = field(default_factory=dict)

    def text(self, lang: str) -> str:
        return t(self.key, lang).format(**{k: v.text(lang) if isinstance(v, Phrase) else v
                                           for k, v in self.fields.items()})


class Refusal(ValueError):
    """A refusal the page shows in the tab's language (app/delivery.py); str() is the English text, which is
    what logs, tests and API clients read."""

    def __init__(self, key: str, **fields):
        self.phrase = Phrase(key, fields)
        super().__init__(self.phrase.text("en"))

    def text(self, lang: str) -> str:
        return self.phrase.text(lang)
