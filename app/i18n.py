"""UI strings in English and Russian, and the short explanation that heads each panel."""
from __future__ import annotations

EXAMPLES = {
    "en": ["What is gravity?", "Write a haiku about the Moon.", "Explain the KV cache in one paragraph.",
           "List three uses of Python."],
    "ru": ["Что такое гравитация?", "Напиши хокку о Луне.", "Почему небо голубое?", "Назови три планеты."],
}

UI = {
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
    "seed": {"en": "Seed", "ru": "Seed"},
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
    "bad_token": {"en": "Wrong presenter token: look for it in the server's console output.",
                  "ru": "Неверный токен ведущего: он напечатан в консоли сервера."},
    "presenting": {"en": "You are presenting: viewers who open /follow see every step of this session.",
                   "ru": "Вы ведёте лекцию: зрители на странице /follow видят каждый шаг этой сессии."},
    "not_presenting": {"en": "Lecture mode stopped; viewers keep the last frame.",
                       "ru": "Показ завершён; у зрителей остаётся последний кадр."},
    "you_present": {"en": "You are presenting", "ru": "Вы ведёте лекцию"},
    "other_presents": {"en": "Another tab is presenting", "ru": "Лекцию ведёт другая вкладка"},
    "nobody_presents": {"en": "Nobody is presenting", "ru": "Сейчас никто не ведёт лекцию"},
    "viewers": {"en": "viewers", "ru": "зрителей"},
    # the room panel (app/charts/room.py): one shared engine, every tab's sequences batched together
    "room_you": {"en": "you", "ru": "вы"},
    "room_no_steps": {"en": "No steps yet: press Step or Run — every tab's steps appear here.",
                      "ru": "Шагов ещё нет: нажмите «Шаг» или «Запуск» — здесь появятся шаги всех вкладок."},
    "room_replay": {"en": "A recording holds one tab's view only: the room's shared engine is shown live.",
                    "ru": "Запись хранит вид только одной вкладки: общий движок комнаты виден только вживую."},
    "room_more": {"en": "+{n} more", "ru": "ещё {n}"},
    "room_step": {"en": "step", "ru": "шаг"},
    "room_seq": {"en": "seq", "ru": "посл."},
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
    "room_tps_title": {"en": "Tokens per second: the whole room vs each tab (last {w} s)",
                       "ru": "Токенов в секунду: вся комната и каждая вкладка (за {w} с)"},
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
    "tour": {"en": "Guided tour", "ru": "Экскурсия"},
    "spec_box": {"en": "Speculative decoding", "ru": "Спекулятивное декодирование"},
    "spec_on": {"en": "Draft and verify (applies to new requests)", "ru": "Черновик и проверка (для новых запросов)"},
    "spec_method": {"en": "Drafter", "ru": "Черновик"},
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
    "trace_bad": {"en": "This file is not a usable InferLab trace", "ru": "Этот файл — не запись InferLab"},
    "replay_pos": {"en": "Replay: step {pos} of {n}.", "ru": "Запись: шаг {pos} из {n}."},
    "chart": {"en": "Chart", "ru": "График"},
    "format": {"en": "Format", "ru": "Формат"},
    "export_btn": {"en": "Export chart", "ru": "Экспорт графика"},
    "download": {"en": "Download", "ru": "Скачать"},
    "export_pick": {"en": "Pick a chart to export.", "ru": "Выберите график для экспорта."},
    "export_done": {"en": "{name} is ready: download it below.", "ru": "{name} готов — скачайте ниже."},
    # the commands' own messages (app/commands.py)
    "queued": {"en": "Request #{rid} queued: press Step to watch it join the batch.",
               "ru": "Запрос №{rid} в очереди: нажмите «Шаг», чтобы он вошёл в батч."},
    "forced": {"en": "Token {id} ({text}) will be forced at the next step.",
               "ru": "Токен {id} ({text}) будет навязан на следующем шаге."},
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
}

PANELS = [
    ("template", {"en": "1 · Chat template & tokens", "ru": "1 · Шаблон чата и токены"},
     {"en": "The model never sees your text as typed: the chat template wraps it in role markers (special "
            "tokens, highlighted), and byte-level BPE cuts the result into tokens. Hover a chip for its id and "
            "UTF-8 bytes; Cyrillic letters take two bytes each, so Russian text needs more tokens than English.",
      "ru": "Модель не видит текст в том виде, как вы его набрали: шаблон чата оборачивает его служебными "
            "токенами ролей (подсвечены), а байтовый BPE режет результат на токены. Наведите на фишку — увидите "
            "id и байты UTF-8; кириллическая буква занимает два байта, поэтому русскому тексту нужно больше токенов."}),
    ("embeddings", {"en": "2 · Embeddings", "ru": "2 · Эмбеддинги"},
     {"en": "Each token id selects one row of the embedding matrix: a vector of the model's hidden size. The "
            "scatter projects this sequence's vectors to 2-D with PCA; the bars list the vocabulary entries whose "
            "vectors point the same way (cosine similarity) as the chosen token's.",
      "ru": "Каждый id токена выбирает строку матрицы эмбеддингов — вектор размерности скрытого слоя. Точки — "
            "проекция векторов этой последовательности на плоскость (PCA); столбцы — токены словаря, чьи векторы "
            "ближе всего по косинусу к выбранному."}),
    ("layers", {"en": "3 · Layers & attention", "ru": "3 · Слои и внимание"},
     {"en": "In every layer each head decides how much each earlier token matters for the current one. During "
            "prefill the whole triangle is computed at once; each decode step adds one row, reading the older keys "
            "and values from the KV cache. The logit lens applies the final norm and the output head to every "
            "layer's residual stream: watch the answer form as depth grows (a token is written where it differs from "
            "the layer below; hover a cell for the top 5).",
      "ru": "В каждом слое каждая голова решает, насколько каждый предыдущий токен важен для текущего. На "
            "префилле весь треугольник считается сразу; каждый шаг декодирования добавляет одну строку, читая "
            "старые ключи и значения из KV-кэша. «Логит-линза» применяет финальную нормализацию и выходную голову "
            "к остаточному потоку каждого слоя — видно, как ответ складывается с глубиной (токен подписан там, где он "
            "отличается от слоя ниже; наведите на клетку, чтобы увидеть топ-5)."}),
    ("logits", {"en": "4 · Logits → softmax", "ru": "4 · Логиты → softmax"},
     {"en": "The last layer's vector for the newest position is multiplied by the output matrix: one score "
            "(logit) per vocabulary entry. Softmax turns scores into probabilities. Entropy says how unsure the "
            "model is; perplexity summarises how surprising the kept tokens were.",
      "ru": "Вектор последнего слоя для новой позиции умножается на выходную матрицу — по одной оценке (логиту) "
            "на каждый токен словаря. Softmax превращает оценки в вероятности. Энтропия показывает неуверенность "
            "модели, перплексия — насколько неожиданными были выбранные токены."}),
    ("sampling", {"en": "5 · The sampling chain", "ru": "5 · Цепочка сэмплирования"},
     {"en": "Penalties, temperature, min-p, top-k and top-p run in this order, each cutting or reshaping the "
            "distribution (grey bars were removed; the rest is renormalised). Then a uniform random number u is "
            "drawn and the token where the cumulative distribution first exceeds u is chosen. Move a slider: the "
            "chain is recomputed from this step's logits with the same u, without rerunning the model.",
      "ru": "Штрафы, температура, min-p, top-k и top-p применяются именно в таком порядке, каждый срезает или "
            "перекраивает распределение (серые столбцы отброшены, остальное перенормировано). Затем берётся "
            "случайное u, и выбирается токен, на котором накопленная вероятность впервые превышает u. Подвигайте "
            "ползунок — цепочка пересчитается по логитам этого шага с тем же u, без повторного прогона модели."}),
    ("detok", {"en": "6 · Detokenizer & stream", "ru": "6 · Детокенизатор и поток"},
     {"en": "Tokens are bytes, and one character can be split across tokens: the detokenizer holds back an "
            "incomplete UTF-8 character instead of printing '�', and holds back text that might be the start of a "
            "stop string. Held-back parts are shown in orange.",
      "ru": "Токены — это байты, и один символ может оказаться разрезан между токенами: детокенизатор "
            "придерживает неполный символ UTF-8 вместо вывода '�' и придерживает текст, который может оказаться "
            "началом стоп-строки. Придержанное показано оранжевым."}),
    ("kv", {"en": "7 · Paged KV cache", "ru": "7 · Страничный KV-кэш"},
     {"en": "Keys and values of past tokens live in fixed-size blocks. Each sequence has a block table mapping "
            "its logical blocks to physical ones; sequences with a common prefix share blocks (refcount > 1), and "
            "finished blocks stay cached for reuse until evicted. A naive allocator would reserve the whole "
            "maximum length per sequence up front.",
      "ru": "Ключи и значения прошлых токенов хранятся в блоках фиксированного размера. У каждой "
            "последовательности есть таблица блоков — отображение логических блоков в физические; "
            "последовательности с общим префиксом делят блоки (refcount > 1), а освободившиеся блоки остаются в "
            "кэше до вытеснения. Наивный аллокатор сразу зарезервировал бы максимальную длину."}),
    ("timeline", {"en": "8 · Timeline & roofline", "ru": "8 · Хронология и roofline"},
     {"en": "Prefill processes many tokens in one pass and is limited by arithmetic; decode produces one token "
            "per sequence per pass and is limited by how fast the weights stream from memory. The roofline uses "
            "this machine's measured bandwidth and matmul speed; each step is a point. Times are engine time.",
      "ru": "Префилл обрабатывает много токенов за проход и упирается в вычисления; декодирование даёт один "
            "токен на последовательность за проход и упирается в скорость чтения весов из памяти. Roofline "
            "построен по измеренной пропускной способности и скорости умножения матриц этой машины; каждый шаг — "
            "точка. Время — время работы движка."}),
    ("speculative", {"en": "9 · Speculative decoding", "ru": "9 · Спекулятивное декодирование"},
     {"en": "A cheap drafter guesses k tokens; the model checks all of them in ONE forward pass. Each draft x is "
            "kept when a uniform u ≤ p(x)/q(x) (p: the model, q: the drafter); at the first rejection a token is "
            "drawn from the leftover max(p − q, 0), and if all pass the model adds a bonus token. The output has "
            "exactly the model's distribution, yet one pass can yield up to k+1 tokens; rejected drafts' KV "
            "slots are rolled back.",
      "ru": "Дешёвый черновик угадывает k токенов; модель проверяет их все за ОДИН проход. Токен x черновика "
            "принимается, если равномерное u ≤ p(x)/q(x) (p — модель, q — черновик); при первом отказе токен "
            "берётся из остатка max(p − q, 0), а если приняты все — модель добавляет бонусный токен. Выход имеет "
            "в точности распределение модели, но один проход даёт до k+1 токенов; KV-слоты отвергнутых токенов "
            "откатываются."}),
    ("room", {"en": "10 · The room: one engine for everyone", "ru": "10 · Комната: один движок на всех"},
     {"en": "Every tab in this room talks to ONE engine. Each step batches the sequences of every tab that is "
            "running into a single forward pass, so when everyone presses Run at once the batches grow and the "
            "room's tokens per second rise while each tab's own speed stays about the same. Sequences not in a "
            "step are held: they keep their KV blocks and continue where they stopped. Tabs that share a prompt "
            "prefix (the same system prompt) share its KV blocks; when the pool is full the engine preempts a "
            "sequence and recomputes it later.",
      "ru": "Все вкладки этой комнаты работают с ОДНИМ движком. Каждый шаг собирает последовательности всех "
            "запущенных вкладок в один прямой проход: когда все разом нажимают «Запуск», батчи растут, и "
            "токенов в секунду у комнаты становится больше, а скорость каждой вкладки почти не меняется. "
            "Последовательности вне шага отложены: их блоки KV сохраняются, и они продолжают с того же места. "
            "Вкладки с общим началом запроса (одинаковый системный промпт) делят его блоки KV; когда пул "
            "заполнен, движок вытесняет последовательность и позже пересчитывает её."}),
]


def t(key: str, lang: str) -> str:
    entry = UI.get(key)
    if entry is None:
        return key
    return entry["ru"] if lang == "ru" else entry["en"]  # anything but "ru" (even junk a client sent) is English
