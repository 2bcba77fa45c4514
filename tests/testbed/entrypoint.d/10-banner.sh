_name=${NVIDIA_PRODUCT_NAME:-}
_rule=$(printf '%*s' $(( ${#_name} + 6 )) '' | tr ' ' '=')
printf '\n%s\n== %s ==\n%s\n\n' "$_rule" "$_name" "$_rule"
