KINDS = []
