"""Write a tokenizer-only GGUF (every tokenizer.* key, no tensors) from a model.

The GPU host cannot download the real models, and synthetic models only need
their tokenizer metadata; a ~5 MB extract generates byte-identical synthetic
files there (the generator copies these keys byte for byte).
Usage: python scripts/gpu/tokenizer_extract.py MODEL.gguf OUT.gguf
"""

import sys

from gguf import GGUFReader, GGUFValueType, GGUFWriter

src, dst = sys.argv[1], sys.argv[2]
r = GGUFReader(src)
w = GGUFWriter(dst, r.fields["general.architecture"].contents())
for key, field in r.fields.items():
    if key.startswith("tokenizer."):
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), vtype)
w.write_header_to_file()
w.write_kv_data_to_file()
w.close()
