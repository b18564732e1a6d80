"""Dependency graphs of the source tree, shared by the layout tests."""


def find_cycle(refs):
    """A cycle of ``refs`` (node -> the nodes it uses: a set, or a dict keyed
    by them) as [a, b, ..., a], or None."""
    state = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for succ in sorted(refs.get(node, ())):
            if state.get(succ) == 1:
                return path[path.index(succ):] + [succ] if succ in path else [node, succ]
            if succ not in state:
                found = visit(succ, path + [succ])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(refs):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None
