"""PyG's task: a two-layer GCN trains 20 steps on a small graph; torch_scatter aggregates."""

import torch
import torch_scatter
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

edges = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
graph = Data(x=torch.randn(4, 8), edge_index=edges, y=torch.tensor([0, 1, 0, 1]))
conv1, conv2 = GCNConv(8, 16), GCNConv(16, 2)
optimizer = torch.optim.Adam([*conv1.parameters(), *conv2.parameters()], lr=0.05)
for _ in range(20):
    out = conv2(conv1(graph.x, graph.edge_index).relu(), graph.edge_index)
    loss = torch.nn.functional.cross_entropy(out, graph.y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
summed = torch_scatter.scatter_add(torch.ones(6), edges[1], dim=0)
assert summed.tolist() == [1.0, 2.0, 2.0, 1.0], summed
print("pyg: GCN trained 20 steps, loss", float(loss))
