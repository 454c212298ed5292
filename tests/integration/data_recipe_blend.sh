#!/usr/bin/env bash
# The data.blend recipe key: YAML list and --set forms, printing that reads
# back, and one-line errors naming the file, line and key.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
"$MTRAIN" data generate --out a --docs 50 >/dev/null && "$MTRAIN" data generate --out b --docs 50 --seed 2 >/dev/null
printf 'data:\n  blend:\n    - {path: a, weight: 0.7}\n    - path: b\n      weight: 0.3\n' >r.yaml
expect_exit blend_recipe_loads 0 "$MTRAIN" pretrain r.yaml --dry-run
expect_output blend_recipe_printed 'blend: \[\{path: "a", weight: 0.7\}, \{path: "b", weight: 0.3\}\]'
grep -A3 '^data:' "$TMP/out" >printed.yaml
expect_exit blend_printed_reloads 0 "$MTRAIN" pretrain printed.yaml --dry-run
expect_output blend_printed_same 'blend: \[\{path: "a", weight: 0.7\}, \{path: "b", weight: 0.3\}\]'
expect_exit blend_set 0 "$MTRAIN" pretrain r.yaml --dry-run --set data.blend=a:1,b:3
expect_output blend_set_value 'blend: \[\{path: "a", weight: 1\}, \{path: "b", weight: 3\}\]'
expect_exit blend_set_bad 2 "$MTRAIN" pretrain r.yaml --dry-run --set data.blend=a
expect_output blend_set_bad_message "key 'data.blend': expected PATH:WEIGHT"
printf 'data:\n  blend:\n    - {path: a, weight: -1}\n' >bad.yaml
expect_exit blend_negative_weight 2 "$MTRAIN" pretrain bad.yaml --dry-run
expect_output blend_negative_weight_message "^mtrain: error: bad.yaml:3:7: key 'data.blend': .*weight -1 must be a positive"
printf 'data:\n  blend:\n    - {path: a, wait: 1}\n' >bad.yaml
expect_exit blend_unknown_field 2 "$MTRAIN" pretrain bad.yaml --dry-run
expect_output blend_unknown_field_message "bad.yaml:3:17: key 'data.blend': entry 0: unknown field 'wait'"
printf 'data:\n  path: a\n  blend: [{path: b, weight: 1}]\n' >bad.yaml
expect_exit blend_and_path 2 "$MTRAIN" pretrain bad.yaml --dry-run
expect_output blend_and_path_message "data.blend.*not both"
printf 'data:\n  blend: [{path: nowhere, weight: 1}]\n' >bad.yaml
expect_exit blend_missing_dir 2 "$MTRAIN" pretrain bad.yaml # a training run: the dry run does not open the data
expect_output blend_missing_dir_message "entry 0: dataset directory 'nowhere' does not exist"
exit $FAILED
