"""Prints the shell commands of the README's "The two commands" section, one a line."""

import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
commands = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)
if len(commands) != 2:
    sys.exit(f"expected two commands in the README's section, found {len(commands)}")
print("\n".join(commands))
